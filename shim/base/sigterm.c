/* SIGTERM while a trace is recorded (sigterm.h).
 *
 * How jobs end (`timeout`, CI job limits, Slurm, Kubernetes) is SIGTERM;
 * by default it ends the process at once, and a trace would lose what its
 * writer had not flushed. So while a trace is recorded, the kernel holds
 * the shim's handler for SIGTERM, and the program's own disposition is
 * kept here (`g_view`): every query answers it, every change goes through
 * it (hooks/signals.c: sigaction, signal, bsd_signal, ssignal,
 * sysv_signal, __sysv_signal, sigset, sigignore, siginterrupt). The
 * handler runs the flush (tracewriter.c: async-signal-safe, bounded), then
 * the program's handler with its own arguments (SA_SIGINFO or not), or,
 * for the default action, puts SIG_DFL back and lets SIGTERM end the
 * process as it would have (a parent sees WIFSIGNALED, WTERMSIG 15). A
 * disposition of SIG_IGN is the kernel's own: the shim's handler is not
 * installed then.
 *
 * Exactness: a change is made for real first (`__sigaction`, the C
 * library's own entry, which the shim does not export) and read back, so
 * the record holds what the kernel and the C library make of it (their
 * flags, SA_RESTORER and restorer included); then the shim's handler goes
 * back in with the program's mask and flags (plus SA_SIGINFO), so that
 * the kernel blocks, defers, restarts and picks the stack for the program's
 * handler as it would. SA_RESETHAND: the kernel resets the real handler at
 * delivery; the handler then records SIG_DFL (flags kept, as the kernel
 * keeps them) and installs itself again.
 *
 * Lock: `g_spin`, a spin lock over the record, held for a few system calls
 * with every signal blocked (the handler takes it too, and sigaction may
 * be called from a handler); no other lock is ever taken with it, nothing
 * waits while holding it. A fork child resets it. Never allocates, never
 * logs: sigaction is async-signal-safe and so must this be. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sigterm.h"

#include "loader.h"

/* The C library's sigaction under its other name: the shim exports
 * `sigaction` (hooks/signals.c), not this one. */
extern int __sigaction(int sig, const shim_sigaction *act, shim_sigaction *old);

/* The flag the C library sets on every disposition it installs (with its
 * own restorer), and reports back in queries; its headers do not name it. */
#ifndef SA_RESTORER
#define SA_RESTORER 0x04000000
#endif

static atomic_flag g_spin = ATOMIC_FLAG_INIT;
static atomic_bool g_active;
static shim_sigterm_flush_fn g_flush;   /* written once, before g_active */
/* Guarded by g_spin. */
static shim_sigaction g_view;         /* the program's disposition of SIGTERM */
static atomic_bool g_interrupt;         /* siginterrupt(SIGTERM, 1) was the last word */

static void lock(sigset_t *saved)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, saved);
    while (atomic_flag_test_and_set_explicit(&g_spin, memory_order_acquire))
        sched_yield();
}

static void unlock(const sigset_t *saved)
{
    atomic_flag_clear_explicit(&g_spin, memory_order_release);
    pthread_sigmask(SIG_SETMASK, saved, NULL);
}

static void on_term(int sig, siginfo_t *info, void *uc);

/* The shim's handler in the kernel, with the recorded mask and flags.
 * g_spin held; the recorded handler is not SIG_IGN. */
static void install_ours_locked(void)
{
    shim_sigaction ours;
    memset(&ours, 0, sizeof ours);
    ours.sa_sigaction = on_term;
    ours.sa_mask = g_view.sa_mask;
    ours.sa_flags = (g_view.sa_flags & ~SA_RESTORER) | SA_SIGINFO;
    __sigaction(SIGTERM, &ours, NULL);
}

static void on_term(int sig, siginfo_t *info, void *uc)
{
    int saved_errno = errno;
    sigset_t m;
    lock(&m);
    shim_sigaction v = g_view;
    if (v.sa_handler != SIG_DFL && v.sa_handler != SIG_IGN && (v.sa_flags & SA_RESETHAND)) {
        /* The kernel reset the real disposition as it delivered: so is
         * the program's now, and the shim's handler goes back in. */
        g_view.sa_handler = SIG_DFL;
        install_ours_locked();
    }
    unlock(&m);
    if (v.sa_handler == SIG_IGN) {
        errno = saved_errno;   /* made SIG_IGN meanwhile: as the kernel would have */
        return;
    }
    bool dies = v.sa_handler == SIG_DFL;
    if (g_flush)
        g_flush(dies);
    if (dies) {
        /* The default action, as without the shim: SIG_DFL in the kernel,
         * SIGTERM pending on this thread, then unblocked (the handler's
         * mask blocked it): the process ends by SIGTERM here. */
        shim_sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        __sigaction(sig, &dfl, NULL);
        syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), sig);
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, sig);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
        errno = saved_errno;
        return;
    }
    errno = saved_errno;
    if (v.sa_flags & SA_SIGINFO)
        v.sa_sigaction(sig, info, uc);
    else
        v.sa_handler(sig);
}

void shim_sigterm_install(shim_sigterm_flush_fn flush)
{
    g_flush = flush;
    sigset_t m;
    lock(&m);
    if (__sigaction(SIGTERM, NULL, &g_view) == 0) {
        if (g_view.sa_handler != SIG_IGN)
            install_ours_locked();
        atomic_store(&g_active, true);
    }
    unlock(&m);
}

SHIM_NO_SANITIZE bool shim_sigterm_owned(int sig)
{
    return sig == SIGTERM && atomic_load_explicit(&g_active, memory_order_acquire);
}

int shim_sigterm_sigaction(const shim_sigaction *act, shim_sigaction *old)
{
    sigset_t m;
    lock(&m);
    shim_sigaction prev = g_view;
    int rc = 0;
    if (act) {
        /* For real first: the C library and the kernel check it and say
         * what they make of it; that is the program's disposition. */
        rc = __sigaction(SIGTERM, act, NULL);
        if (rc == 0) {
            __sigaction(SIGTERM, NULL, &g_view);
            if (g_view.sa_handler != SIG_IGN)
                install_ours_locked();
        }
    }
    int err = errno;
    unlock(&m);
    if (rc == 0 && old)
        *old = prev;
    errno = err;
    return rc;
}

void shim_sigterm_set_interrupt(bool flag)
{
    atomic_store(&g_interrupt, flag);
}

bool shim_sigterm_interrupts(void)
{
    return atomic_load(&g_interrupt);
}

void shim_sigterm_atfork_child(void)
{
    atomic_flag_clear(&g_spin);
}
