/* The order allocator lock -> (release) -> GIL, checked in debug builds:
 * python_gc's pressure callback reached with an allocator lock still held
 * (the mutant "the collection run with the allocator lock held", which
 * otherwise deadlocks with the GIL until a test's child is killed) aborts
 * at once with one line naming the order; reached as the contract says
 * (the lock it was given released), it goes on. Also the per-thread count
 * of allocator locks the check reads (lock.h). */
#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lock.h"
#include "mutex.h"
#include "options.h"
#include "pressure.h"
#include "pygc.h"

/* A pressure event on a lock of its own, with python_gc's callback
 * registered (no interpreter in this process: it finds none and returns).
 * `also_held`: an allocator lock the thread keeps across the event, so
 * that the callback's release of the event's lock leaves one held. */
struct counts {
    uint64_t events, callback_runs;
};

static struct counts pressure_event_with_the_collector(spyreshim_lock *also_held)
{
    setenv("SPYRESHIM_GC", "1", 1);
    shim_options_reload();
    shim_pygc_init();
    /* The gate (the caller policy) unwinds and asks the loader who called,
     * which a held lock forbids on its own (loader.c); not what is tested. */
    shim_pressure_set_gate(NULL);
    spyreshim_lock lock;
    shim_lock_init(&lock);
    shim_pressure_state ps;
    shim_pressure_state_init(&ps);
    if (also_held)
        shim_lock_acquire(also_held);
    shim_lock_acquire(&lock);
    shim_pressure_relieve(&ps, &lock, 1);
    shim_lock_release(&lock);
    if (also_held)
        shim_lock_release(also_held);
    return (struct counts){ps.events, ps.callback_runs};
}

Test(lock_order, the_collector_reached_without_an_allocator_lock_goes_on)
{
    struct counts s = pressure_event_with_the_collector(NULL);
    cr_assert_eq(s.events, 1);
    cr_assert_eq(s.callback_runs, 1, "the collector's callback ran and returned");
    cr_assert_eq(shim_locks_held(), 0);
}

#ifndef NDEBUG
Test(lock_order, counts_allocator_locks_only)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    spyreshim_lock device, arena;
    shim_lock_init(&device);
    shim_lock_init_fast(&arena);
    cr_assert_eq(shim_tls_alloc_locks_held, 0);
    shim_mutex_lock(&mu);
    shim_lock_acquire(&device);
    cr_assert(shim_lock_try(&arena));
    cr_assert_eq(shim_tls_alloc_locks_held, 2, "a mutex of ours is not an allocator lock");
    shim_lock_release(&arena);
    shim_lock_release(&device);
    cr_assert_eq(shim_tls_alloc_locks_held, 0);
    shim_mutex_unlock(&mu);
    shim_lock_assert_none_held("the GIL"); /* none held: no abort */
}

/* Longest wait for the child (a bound on a hang, not on its speed). */
#define CHILD_BOUND_MS 60000

Test(lock_order, the_collector_reached_with_an_allocator_lock_held_aborts_naming_the_order)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        signal(SIGABRT, SIG_DFL);
        dup2(fds[1], 2);
        close(fds[0]);
        spyreshim_lock arena;
        shim_lock_init_fast(&arena);
        pressure_event_with_the_collector(&arena);
        _exit(0);
    }
    close(fds[1]);
    char out[4096];
    size_t len = 0;
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int waited_ms = 0;
    for (;;) {
        int r = poll(&p, 1, 1000);
        if (r == 0 && (waited_ms += 1000) >= CHILD_BOUND_MS)
            break;
        if (r <= 0)
            continue;
        ssize_t n = read(fds[0], out + len, sizeof out - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    out[len] = '\0';
    close(fds[0]);
    if (waited_ms >= CHILD_BOUND_MS)
        kill(pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(waited_ms < CHILD_BOUND_MS, "the child hung: the order is not checked\n%s", out);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
              "the child was not aborted (status %#x):\n%s", status, out);
    cr_assert_not_null(strstr(out, "lock order: allocator lock held while taking the GIL"),
                       "the abort does not name the order:\n%s", out);
    cr_assert_not_null(strstr(out, "pygc.c:"), "the line names where:\n%s", out);
}
#endif
