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

/* For lock primitives that are not a plain pthread mutex taken here. */
void shim_locks_note_acquired(void);
void shim_locks_note_released(void);

/* How many shim locks the calling thread holds now. */
unsigned shim_locks_held(void);

#endif
