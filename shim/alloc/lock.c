/* The allocator lock (see lock.h). Owns nothing but the mutex and the
 * owner word; `owner` is written only by the holder, read by anyone (the
 * contract checks and the re-entrant free path). Counted in the thread's
 * shim locks (mutex.h) like every other lock of ours, so that a loader
 * call made while holding it is caught; in debug builds also in a count of
 * allocator locks of its own (shim_tls_alloc_locks_held), so that taking
 * the GIL while holding one is caught.
 * Locks, their order and fork: docs/locking.md. */
#include "lock.h"
#include "log.h"

#include <stdlib.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "mutex.h"

void shim_lock_init(spyreshim_lock *l)
{
    pthread_mutex_init(&l->mu, NULL);
    l->fast = false;
    atomic_store_explicit(&l->word, 0, memory_order_relaxed);
    atomic_store_explicit(&l->owner, 0, memory_order_relaxed);
}

void shim_lock_init_fast(spyreshim_lock *l)
{
    shim_lock_init(l);
    l->fast = true;
}

/* Rounds of spinning before sleeping: an arena's critical section is a
 * few hundred nanoseconds, a sleep and a wake-up several microseconds
 * (two threads sharing an arena slept on every other call). */
#define FAST_SPINS 100

/* Contended: spin a while, then mark the word "held, with waiters" and
 * sleep until a release finds that mark (the classic three-state futex
 * mutex). */
void shim_lock_fast_wait(spyreshim_lock *l)
{
    for (int i = 0; i < FAST_SPINS; i++) {
        unsigned z = 0;
        if (atomic_load_explicit(&l->word, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(&l->word, &z, 1, memory_order_acquire,
                                                  memory_order_relaxed))
            return;
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    while (atomic_exchange_explicit(&l->word, 2, memory_order_acquire) != 0)
        syscall(SYS_futex, &l->word, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
}

void shim_lock_fast_wake(spyreshim_lock *l)
{
    syscall(SYS_futex, &l->word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#ifndef NDEBUG
void shim_lock_assert_held_fail(const char *file, int line)
{
    shim_warn("%s:%d: the allocator lock is not held by this thread", file, line);
    abort();
}

/* initial-exec, as mutex.c's count: one %fs-relative access. */
__thread unsigned shim_tls_alloc_locks_held __attribute__((tls_model("initial-exec")));

/* The other way round can deadlock: a thread holding the GIL (an allocation
 * from Python, a finalizer the collection runs) waits for this lock. */
void shim_lock_order_fail(const char *what, const char *file, int line)
{
    shim_warn("%s:%d: lock order: allocator lock held while taking %s (%u held; the order is "
              "allocator lock -> (release) -> %s, docs/locking.md)",
              file, line, what, shim_tls_alloc_locks_held, what);
    abort();
}
#endif

int shim_lock_timedwait(spyreshim_lock *l, pthread_cond_t *cv, const struct timespec *deadline)
{
    if (l->fast)
        abort(); /* a condition variable needs the mutex kind */
    atomic_store_explicit(&l->owner, 0, memory_order_relaxed);
    int rc = pthread_cond_timedwait(cv, &l->mu, deadline);
    atomic_store_explicit(&l->owner, shim_lock_self(), memory_order_relaxed);
    return rc;
}

SPYRESHIM_API void spyreshim_lock_release(spyreshim_lock *lock)
{
    shim_lock_release(lock);
}

SPYRESHIM_API void spyreshim_lock_acquire(spyreshim_lock *lock)
{
    shim_lock_acquire(lock);
}
