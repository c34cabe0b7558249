/* Every mutex of the shim, counted per thread: the loader wrapper
 * (loader.h) asserts that a thread holds none of them when it calls into
 * the dynamic loader (docs/locking.md). The allocator lock counts itself
 * through shim_locks_note_*; every other pthread mutex of the shim is taken
 * through shim_mutex_lock/unlock. */
#ifndef SHIM_MUTEX_H
#define SHIM_MUTEX_H

#include <pthread.h>

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

/* How many shim locks the calling thread holds now. */
unsigned shim_locks_held(void);

#endif
