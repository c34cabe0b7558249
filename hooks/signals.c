/* The entry points that set or read a signal's disposition, intercepted
 * for SIGTERM only (shim/base/sigterm.c has why and what holds): while a
 * trace is recorded, the kernel holds the shim's handler for SIGTERM, and
 * these answer and change the program's own disposition instead, exactly
 * as the C library would (its signal() keeps BSD semantics and
 * siginterrupt's word; sysv_signal is one-shot; sigset has SIG_HOLD).
 * Every other signal, and SIGTERM while no trace is recorded, goes to the
 * C library untouched. Async-signal-safe as the C library's own (no lock
 * but sigterm.c's, no allocation); the real functions are found once,
 * when the library loads.
 *
 * Not seen: the rt_sigaction system call made directly (Go's runtime does
 * so) and the C library's `__sigaction`, the shim's own way to the real
 * function: such a program finds the shim's handler there. */
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "hooks.h"
#include "loader.h"
#include "sigterm.h"

#define EXPORT __attribute__((visibility("default")))

extern int __sigaction(int sig, const struct sigaction *act, struct sigaction *old);

typedef __sighandler_t (*handler_fn)(int, __sighandler_t);

/* The real functions the shim forwards to (sigaction's is __sigaction). */
#define SIGNAL_ENTRY_POINTS(X)                                                       \
    X(SIGNAL, signal) X(SIGNAL, bsd_signal) X(SIGNAL, ssignal) X(SIGNAL, sysv_signal) \
    X(SIGNAL, __sysv_signal) X(SIGSET, sigset) X(SIGIGNORE, sigignore)              \
    X(SIGINTERRUPT, siginterrupt)

static struct {
#define SLOT_(role, name) void *_Atomic name;
    SIGNAL_ENTRY_POINTS(SLOT_)
#undef SLOT_
} real;

static void resolve_all(void)
{
#define RESOLVE_(role, name)                                                  \
    if (!atomic_load_explicit(&real.name, memory_order_acquire))              \
        atomic_store_explicit(&real.name, shim_real_dlsym(RTLD_NEXT, #name),  \
                              memory_order_release);
    SIGNAL_ENTRY_POINTS(RESOLVE_)
#undef RESOLVE_
}

/* Found when the library loads, before the program can be in a handler. */
__attribute__((constructor)) static void signals_init(void)
{
    resolve_all();
}

#define REAL(name) \
    (atomic_load_explicit(&real.name, memory_order_acquire) ? (void)0 : resolve_all(), \
     atomic_load_explicit(&real.name, memory_order_acquire))

/* A sanitizer's runtime installs its handlers through here while it
 * initializes: nothing on this path is instrumented (loader.h). */
EXPORT SHIM_NO_SANITIZE int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
    if (shim_sigterm_owned(sig))
        return shim_sigterm_sigaction(act, old);
    return __sigaction(sig, act, old);
}

/* SIGTERM's disposition set as the C library's functions set it: `flags`
 * and a mask of `sig` alone or nothing. */
static __sighandler_t set_term(__sighandler_t h, bool mask_it, int flags)
{
    if (h == SIG_ERR) {
        errno = EINVAL;
        return SIG_ERR;
    }
    struct sigaction act, old;
    memset(&act, 0, sizeof act);
    act.sa_handler = h;
    sigemptyset(&act.sa_mask);
    if (mask_it)
        sigaddset(&act.sa_mask, SIGTERM);
    act.sa_flags = flags;
    if (shim_sigterm_sigaction(&act, &old) != 0)
        return SIG_ERR;
    return old.sa_handler;
}

/* signal, bsd_signal, ssignal: the C library's BSD semantics. */
static __sighandler_t bsd_term(__sighandler_t h)
{
    return set_term(h, true, shim_sigterm_interrupts() ? 0 : SA_RESTART);
}

EXPORT __sighandler_t signal(int sig, __sighandler_t h)
{
    if (shim_sigterm_owned(sig))
        return bsd_term(h);
    return ((handler_fn)REAL(signal))(sig, h);
}

EXPORT __sighandler_t bsd_signal(int sig, __sighandler_t h)
{
    if (shim_sigterm_owned(sig))
        return bsd_term(h);
    return ((handler_fn)REAL(bsd_signal))(sig, h);
}

EXPORT __sighandler_t ssignal(int sig, __sighandler_t h)
{
    if (shim_sigterm_owned(sig))
        return bsd_term(h);
    return ((handler_fn)REAL(ssignal))(sig, h);
}

/* sysv_signal, __sysv_signal: one-shot, not deferred, not restarted. */
static __sighandler_t sysv_term(__sighandler_t h)
{
    return set_term(h, false, (SA_RESETHAND | SA_NODEFER | SA_INTERRUPT) & ~SA_RESTART);
}

EXPORT __sighandler_t sysv_signal(int sig, __sighandler_t h)
{
    if (shim_sigterm_owned(sig))
        return sysv_term(h);
    return ((handler_fn)REAL(sysv_signal))(sig, h);
}

EXPORT __sighandler_t __sysv_signal(int sig, __sighandler_t h)
{
    if (shim_sigterm_owned(sig))
        return sysv_term(h);
    return ((handler_fn)REAL(__sysv_signal))(sig, h);
}

EXPORT __sighandler_t sigset(int sig, __sighandler_t disp)
{
    if (!shim_sigterm_owned(sig))
        return ((handler_fn)REAL(sigset))(sig, disp);
    sigset_t set, oset;
    sigemptyset(&set);
    sigaddset(&set, sig);
    struct sigaction old;
    if (disp == SIG_HOLD) {
        if (sigprocmask(SIG_BLOCK, &set, &oset) < 0)
            return SIG_ERR;
        if (sigismember(&oset, sig))
            return SIG_HOLD;
        if (shim_sigterm_sigaction(NULL, &old) < 0)
            return SIG_ERR;
        return old.sa_handler;
    }
    __sighandler_t prev = set_term(disp, false, 0);
    if (prev == SIG_ERR)
        return SIG_ERR;
    if (sigprocmask(SIG_UNBLOCK, &set, &oset) < 0)
        return SIG_ERR;
    return sigismember(&oset, sig) ? SIG_HOLD : prev;
}

EXPORT int sigignore(int sig)
{
    if (!shim_sigterm_owned(sig))
        return ((int (*)(int))REAL(sigignore))(sig);
    return set_term(SIG_IGN, false, 0) == SIG_ERR ? -1 : 0;
}

EXPORT int siginterrupt(int sig, int interrupt)
{
    if (!shim_sigterm_owned(sig))
        return ((int (*)(int, int))REAL(siginterrupt))(sig, interrupt);
    struct sigaction act;
    if (shim_sigterm_sigaction(NULL, &act) < 0)
        return -1;
    shim_sigterm_set_interrupt(interrupt != 0);
    if (interrupt)
        act.sa_flags &= ~SA_RESTART;
    else
        act.sa_flags |= SA_RESTART;
    return shim_sigterm_sigaction(&act, NULL) < 0 ? -1 : 0;
}
