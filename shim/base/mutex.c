/* The per-thread count of shim locks held (mutex.h).
 *
 * Owns one thread-local counter, no lock. Maintained in every build (a
 * thread-local increment, next to a mutex operation that costs far more):
 * debug builds assert on it before every loader call, and the interpreter
 * finder reads it in all builds to skip looking when the caller holds a
 * lock (a pressure callback that allocates before releasing the allocator
 * lock). Must never block or log: it runs inside every lock operation.
 * Locks, their order and fork: docs/locking.md. */
#include "mutex.h"

/* initial-exec: one %fs-relative access instead of a __tls_get_addr call
 * on every lock operation (the library is preloaded or linked, so its TLS
 * is static; a dlopen gets it from glibc's static TLS surplus). */
__thread unsigned shim_tls_locks_held __attribute__((tls_model("initial-exec")));
#define held shim_tls_locks_held

unsigned shim_locks_held(void)
{
    return held;
}

void shim_mutex_lock(pthread_mutex_t *mu)
{
    pthread_mutex_lock(mu);
    held++;
}

void shim_mutex_unlock(pthread_mutex_t *mu)
{
    if (held)
        held--;
    pthread_mutex_unlock(mu);
}
