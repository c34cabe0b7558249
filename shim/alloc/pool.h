/* The pool: the arenas of one device (one per group of threads) sharing
 * one limit. Each arena takes its share of the pool before asking the
 * runtime for a region, so that together they never pass the limit.
 *
 * Guarded by: nothing but atomics (arenas of the same pool ask under
 * their own locks, at the same time).
 * Never: calls the runtime (region.c does, between a take and a give or
 * a note). */
#ifndef SHIM_POOL_H
#define SHIM_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Zero-initialized. */
typedef struct shim_arena_pool {
    _Atomic uint64_t reserved;       /* shares taken, requests in flight included */
    _Atomic uint64_t held;           /* what the runtime gave and was not released */
    _Atomic uint64_t peak_reserved;  /* the most `held` ever was */
} shim_arena_pool;

/* Each takes a NULL pool (an arena of its own): then take always succeeds
 * and the rest do nothing. */

/* Takes a share of `n` bytes before the runtime is asked: false (nothing
 * taken) when that would pass `limit` (0: none). Inline, as the give: a
 * watched object (passthrough.c) takes and gives one per creation and
 * release, tens of nanoseconds in some runtimes (docs/opencl.md, "Cost").
 * _from: of a pool that is one (not NULL). */
static inline bool shim_pool_take_from(shim_arena_pool *p, size_t limit, size_t n)
{
    if (!limit) { /* nothing to hold it to: one add */
        atomic_fetch_add_explicit(&p->reserved, n, memory_order_relaxed);
        return true;
    }
    uint64_t cur = atomic_load_explicit(&p->reserved, memory_order_relaxed);
    do {
        if (cur + n > limit)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&p->reserved, &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

static inline bool shim_pool_take(shim_arena_pool *p, size_t limit, size_t n)
{
    return !p || shim_pool_take_from(p, limit, n);
}

/* Gives back a share the runtime refused, or a watched object's. */
static inline void shim_pool_give(shim_arena_pool *p, size_t n)
{
    if (p)
        atomic_fetch_sub_explicit(&p->reserved, n, memory_order_relaxed);
}
/* The runtime gave the `n` bytes of a share: they count as held, and in
 * the peak. */
void shim_pool_note_held(shim_arena_pool *p, size_t n);
/* A region of `n` bytes went back to the runtime: neither held nor a
 * share any more. */
void shim_pool_release(shim_arena_pool *p, size_t n);

#endif
