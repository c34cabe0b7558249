/* The allocator lock: a plain mutex that remembers its owner, so that the
 * pressure-callback contract can be checked (debug builds assert that a
 * callback returns with the lock held) and so that a free issued by a thread
 * that already holds the lock (a callback that frees before releasing it)
 * does not self-deadlock. Definition of the public opaque spyreshim_lock. */
#ifndef SHIM_LOCK_H
#define SHIM_LOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include "spyreshim.h"
#include "mutex.h"

/* Two kinds, one interface: a device's lock is a pthread mutex (pressure
 * events wait on a condition variable with it); an arena's lock, taken
 * twice a pair and never waited on, is a futex word (0 free, 1 held, 2
 * held with waiters) whose operations are a few inline instructions where
 * glibc's mutex takes about fifty, and none atomic while the process has
 * one thread (shim_single_threaded). */
struct spyreshim_lock {
    pthread_mutex_t mu;          /* !fast */
    _Atomic unsigned word;       /* fast */
    bool fast;                   /* set at init, never changed */
    _Atomic unsigned long owner; /* thread pointer of the holder, 0 if free */
};

/* The calling thread, as `owner` records it: the thread pointer (one
 * register read; glibc's pthread_self() returns the same value through a
 * call). */
static inline unsigned long shim_lock_self(void)
{
#if defined(__x86_64__) || defined(__aarch64__)
    return (unsigned long)__builtin_thread_pointer();
#else
    return (unsigned long)pthread_self();
#endif
}

void shim_lock_init(spyreshim_lock *l);
/* The futex kind: never passed to shim_lock_timedwait. */
void shim_lock_init_fast(spyreshim_lock *l);
/* Out of line: the fast kind's contended paths. */
void shim_lock_fast_wait(spyreshim_lock *l);
void shim_lock_fast_wake(spyreshim_lock *l);

/* Debug builds (and TSan builds, debug by default): how many allocator
 * locks (every spyreshim_lock: a device's, an arena's, the host account's)
 * the calling thread holds, so that the order allocator lock -> (release)
 * -> GIL is asserted where python_gc/ goes for the GIL
 * (shim_lock_assert_none_held). Release builds keep no count: the acquire
 * and release below run on every allocation and free. (The count of every
 * shim lock, mutex.h, is kept in all builds; it cannot tell the allocator
 * lock from a mutex of python_gc/.) */
#ifdef NDEBUG
#define shim_lock_count_acquired() ((void)0)
#define shim_lock_count_released() ((void)0)
#define shim_lock_assert_none_held(what) ((void)0)
#else
extern __thread unsigned shim_tls_alloc_locks_held __attribute__((tls_model("initial-exec")));

static inline void shim_lock_count_acquired(void)
{
    shim_tls_alloc_locks_held++;
}

static inline void shim_lock_count_released(void)
{
    /* A release the thread did not count (a fork child's handler after a
     * prepare on another path, a misuse) must not wrap around. */
    if (shim_tls_alloc_locks_held)
        shim_tls_alloc_locks_held--;
}

/* Aborts, after one line naming the order, unless the calling thread holds
 * no allocator lock; `what` is the lock about to be taken ("the GIL"). */
void shim_lock_order_fail(const char *what, const char *file, int line);
#define shim_lock_assert_none_held(what) \
    (shim_tls_alloc_locks_held == 0 ? (void)0 : shim_lock_order_fail(what, __FILE__, __LINE__))
#endif

/* Acquire, try, release and the ownership test run on every allocation and
 * free: inline.
 *
 * The fast kind. One thread: the word is free (callers never take a lock
 * they hold), and a relaxed store takes it. Threads appearing while it is
 * held (a runtime's first call may start some) find it held and wait with
 * 2; the release, no longer single-threaded, then wakes them. */
static inline bool shim_lock_fast_try(spyreshim_lock *l)
{
    if (shim_single_threaded()) {
        if (atomic_load_explicit(&l->word, memory_order_relaxed) != 0)
            return false;
        atomic_store_explicit(&l->word, 1, memory_order_relaxed);
        return true;
    }
    unsigned z = 0;
    return atomic_compare_exchange_strong_explicit(&l->word, &z, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}

static inline void shim_lock_acquire(spyreshim_lock *l)
{
    if (!l->fast)
        pthread_mutex_lock(&l->mu);
    else if (!shim_lock_fast_try(l))
        shim_lock_fast_wait(l);
    atomic_store_explicit(&l->owner, shim_lock_self(), memory_order_relaxed);
    shim_locks_note_acquired();
    shim_lock_count_acquired();
}

/* Takes the lock only if no thread holds it: false when contended. */
static inline bool shim_lock_try(spyreshim_lock *l)
{
    if (l->fast ? !shim_lock_fast_try(l) : pthread_mutex_trylock(&l->mu) != 0)
        return false;
    atomic_store_explicit(&l->owner, shim_lock_self(), memory_order_relaxed);
    shim_locks_note_acquired();
    shim_lock_count_acquired();
    return true;
}

static inline void shim_lock_release(spyreshim_lock *l)
{
    shim_locks_note_released();
    shim_lock_count_released();
    atomic_store_explicit(&l->owner, 0, memory_order_relaxed);
    if (!l->fast)
        pthread_mutex_unlock(&l->mu);
    else if (shim_single_threaded()) /* no other thread: none waits */
        atomic_store_explicit(&l->word, 0, memory_order_release);
    else if (atomic_exchange_explicit(&l->word, 0, memory_order_release) == 2)
        shim_lock_fast_wake(l);
}

static inline bool shim_lock_held_by_me(const spyreshim_lock *l)
{
    /* Only the holder stores its own id, so a match cannot be stale. */
    return atomic_load_explicit(&l->owner, memory_order_relaxed) == shim_lock_self();
}
/* Debug builds: aborts unless this thread holds `l`. Where the arena and
 * the live table are touched (they have no lock of their own). */
#ifdef NDEBUG
#define shim_lock_assert_held(l) ((void)0)
#else
void shim_lock_assert_held_fail(const char *file, int line);
#define shim_lock_assert_held(l) \
    (shim_lock_held_by_me(l) ? (void)0 : shim_lock_assert_held_fail(__FILE__, __LINE__))
#endif
/* pthread_cond_timedwait on the lock's mutex until `deadline` (the clock
 * `cv` was made with), keeping `owner` right; returns its result
 * (ETIMEDOUT). */
int shim_lock_timedwait(spyreshim_lock *l, pthread_cond_t *cv, const struct timespec *deadline);

#endif
