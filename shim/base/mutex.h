/* Every mutex of the shim, counted per thread: the loader wrapper
 * (loader.h) asserts that a thread holds none of them when it calls into
 * the dynamic loader (docs/locking.md). The allocator lock counts itself
 * through shim_locks_note_*; every other pthread mutex of the shim is taken
 * through shim_mutex_lock/unlock. */
#ifndef SHIM_MUTEX_H
#define SHIM_MUTEX_H

#include <pthread.h>
#include <stdbool.h>
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define SHIM_HAVE_SINGLE_THREADED 1
#endif

void shim_mutex_lock(pthread_mutex_t *mu);
void shim_mutex_unlock(pthread_mutex_t *mu);

/* For lock primitives that are not a plain pthread mutex taken here:
 * inline, as they run inside every allocation and free. */
extern __thread unsigned shim_tls_locks_held __attribute__((tls_model("initial-exec")));

static inline void shim_locks_note_acquired(void)
{
    shim_tls_locks_held++;
}

static inline void shim_locks_note_released(void)
{
    /* A lock released by a thread that did not count it (a fork child
     * handler re-initializing, a misuse) must not wrap around. */
    if (shim_tls_locks_held)
        shim_tls_locks_held--;
}

/* True only while the process has one thread (glibc's own hint, which its
 * mutexes use to skip their atomics; false is always safe). While it
 * holds, nothing can contend for a lock or a shared counter, and a
 * lock-prefixed operation, a full barrier on x86, would only keep the
 * cache misses of one call from overlapping those of the next. */
static inline bool shim_single_threaded(void)
{
#ifdef SHIM_HAVE_SINGLE_THREADED
    return __libc_single_threaded != 0;
#else
    return false;
#endif
}

/* How many shim locks the calling thread holds now. */
unsigned shim_locks_held(void);

#endif
