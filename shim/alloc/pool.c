/* The pool: the shares of one limit that a device's arenas take before
 * they reserve a region (pool.h).
 *
 * Guarded by: atomics only, relaxed: the pool orders no other memory; a
 * share is taken with a compare-and-swap so that two arenas asking at
 * once never pass the limit together.
 * Never: calls the runtime, takes a lock. Off the allocation path: an
 * arena comes here only to reserve or release a region. */
#include "pool.h"

/* The peak counts only what the runtime gave, not shares in flight. */
void shim_pool_note_held(shim_arena_pool *p, size_t n)
{
    if (!p)
        return;
    uint64_t now = atomic_fetch_add_explicit(&p->held, n, memory_order_relaxed) + n;
    uint64_t peak = atomic_load_explicit(&p->peak_reserved, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&p->peak_reserved, &peak, now,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

void shim_pool_release(shim_arena_pool *p, size_t n)
{
    if (p) {
        atomic_fetch_sub_explicit(&p->held, n, memory_order_relaxed);
        shim_pool_give(p, n);
    }
}
