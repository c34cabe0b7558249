/* Regions: reserving them from the runtime (through the arena's backend,
 * within the pool's share), their index by address, the cache of empty
 * ones, and releasing them.
 *
 * Region-size policy (see docs/allocator.md, "Regions"):
 * - The capacity is the runtime's total (backend mem_info) capped by the
 *   limit. The base region size is capacity/64 rounded down to a power of
 *   two, clamped to [2 MiB, 64 MiB], and never above capacity/8 (64 KiB at
 *   least); once more is reserved, a new region is
 *   reserved/REGION_GROWTH_DIV (64), rounded up to 2 MiB (to the base
 *   below 2 MiB), so the number of regions grows slowly while the slack in
 *   the last region stays under 2% of the total. A device under 16 MiB
 *   thus has 8 regions, not a handful: on an 8 MiB device four 2 MiB
 *   regions, each pinned by one small live block, refused a 2 MiB request
 *   with 7.75 MiB free (tests/integration/test_small_device.py).
 * - Sub-bins (SL_COUNT = 64) and the growth divisor were chosen by
 *   bench/run.sh: 32 sub-bins or 1/16 growth cost 1-5 points of
 *   fragmentation on the benchmark traces; speed did not change.
 * - The last region shrinks to what the limit and the runtime's free memory
 *   leave, as long as the request still fits.
 * - A request above half the next region size, when no free block fits it,
 *   gets a dedicated region of its size class (its exact aligned size when
 *   that is all the limit leaves). A request for a region of its own
 *   (shim_arena_alloc_own, grow_own: a block that may be exported) gets
 *   its exact aligned size.
 * - When the runtime refuses a region, smaller ones (halving, down to the
 *   request itself) are tried before giving up.
 * - The region that became empty last, shared or dedicated, stays cached
 *   for reuse (a loop that frees and reallocates a large tensor then costs
 *   no runtime call); an older empty region is released at that moment
 *   (when the free that emptied the newer one is merged: merge_last_free).
 *   A cached dedicated region serves its own size class only (arena.c,
 *   foreign_dedicated). shim_arena_trim releases cached ones (the owner
 *   calls it under pressure), and a request that needs a new region
 *   releases them first (where they were, the runtime places it, as it
 *   would the request without the shim).
 *
 * Guarded by: the owner's allocator lock (the device's shard lock, device_internal.h); nothing here locks
 * (the pool is atomics: pool.c).
 * Never: dereferences a device address, or calls back into the shim (the
 * backend is the only way out). Off the allocation path: an arena comes
 * here when no free block fits, and when a region becomes empty.
 * Locks, their order and fork: docs/locking.md. */
#include "region.h"
#include "pool.h"

#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define REGION_MIN (2 * MIB)            /* from a 16 MiB device up */
#define REGION_COUNT_MIN 8              /* smaller devices: capacity/8 ... */
#define REGION_FLOOR ((size_t)64 << 10) /* ... down to this */
#define REGION_BASE_MAX (64 * MIB)
#ifndef REGION_GROWTH_DIV
#define REGION_GROWTH_DIV 64
#endif

static bool regions_reserve(shim_arena *a)
{
    if (a->free_region != NIL)
        return true;
    uint32_t cap = a->regions_cap ? a->regions_cap * 2 : 16;
    if (cap > RS_REGION_MASK + 1u)
        return false; /* a node keeps its region's id in 28 bits */
    region *nr = realloc(a->regions, (size_t)cap * sizeof *nr);
    if (!nr)
        return false;
    a->regions = nr;
    uint32_t *ns = realloc(a->sorted, (size_t)cap * sizeof *ns);
    if (!ns)
        return false;
    a->sorted = ns;
    for (uint32_t i = cap; i-- > a->regions_cap;) {
        a->regions[i].in_use = false;
        a->regions[i].empty_next = a->free_region;
        a->free_region = i;
    }
    a->regions_cap = cap;
    return true;
}

/* Releases region r, whose single free node is `n` (not in a bin). */
void shim_region_release(shim_arena *a, uint32_t r, uint32_t n)
{
    region *g = &a->regions[r];
    shim_region_set_empty(a, r, false);
    node_drop(a, n);
    uint32_t pos = shim_region_upper(a, g->base) - 1;
    memmove(&a->sorted[pos], &a->sorted[pos + 1], (a->nsorted - pos - 1) * sizeof *a->sorted);
    a->nsorted--;
    /* Out of the pool first: once the runtime has the region back,
     * another arena may get it, and the pool's peak must not count it
     * twice. */
    shim_pool_release(a->pool, g->size);
    a->be.release(a->be.ctx, g->base, g->size);
    a->c.reserved_bytes -= g->size;
    a->c.regions--;
    a->c.regions_released++;
    g->in_use = false;
    g->empty_next = a->free_region;
    a->free_region = r;
}

/* The backend's reserve, within the pool's share: a share the pool cannot
 * give is a refusal for lack of room, like the runtime's. */
static int reserve_shared(shim_arena *a, size_t size, uintptr_t *addr)
{
    if (!shim_pool_take(a->pool, a->limit, size))
        return 1;
    int rc = a->be.reserve(a->be.ctx, size, addr);
    if (rc != 0)
        shim_pool_give(a->pool, size);
    else
        shim_pool_note_held(a->pool, size);
    return rc;
}

static size_t pow2_floor(size_t x)
{
    return x ? (size_t)1 << (63 - __builtin_clzll(x)) : 0;
}

static size_t capacity(shim_arena *a)
{
    if (a->capacity == 0) {
        size_t fr = 0, total = 0;
        if (!a->be.mem_info || a->be.mem_info(a->be.ctx, &fr, &total) != 0 || total == 0)
            total = SIZE_MAX;
        a->capacity = (a->limit && a->limit < total) ? a->limit : total;
    }
    return a->capacity;
}

/* The size of the next shared region, before the limit and the runtime's
 * free memory cut it. */
static size_t next_region_size(shim_arena *a)
{
    if (a->fixed_region)
        return a->fixed_region;
    size_t cap = capacity(a);
    size_t base = pow2_floor(cap / 64);
    if (base < REGION_MIN)
        base = REGION_MIN;
    if (base > REGION_BASE_MAX)
        base = REGION_BASE_MAX;
    size_t few = pow2_floor(cap / REGION_COUNT_MIN);
    if (few < REGION_FLOOR)
        few = REGION_FLOOR;
    if (base > few)
        base = few;
    size_t step = base < REGION_MIN ? base : REGION_MIN;     /* powers of two */
    size_t grow = (size_t)(a->c.reserved_bytes / REGION_GROWTH_DIV);
    grow = (grow + step - 1) & ~(step - 1);
    return align_down(a, grow > base ? grow : base);
}

/* Reserves a region able to hold `need` bytes (bin-rounded) or at least
 * `exact` (aligned) bytes; inserts its single free node and returns it
 * (not in a bin), or NIL. */
uint32_t shim_region_grow(shim_arena *a, size_t need, size_t exact)
{
    if (!regions_reserve(a) || !nodes_reserve(a, 2))
        return NIL;
    size_t room = SIZE_MAX;
    uint64_t held = a->pool ? atomic_load_explicit(&a->pool->reserved, memory_order_relaxed)
                            : a->c.reserved_bytes;
    if (a->limit)
        room = a->limit > held ? align_down(a, a->limit - held) : 0;
    if (exact > room)
        return NIL;
    size_t rs = next_region_size(a);
    if (rs > ((size_t)MAX_UNITS << a->shift))
        rs = (size_t)MAX_UNITS << a->shift;
    /* A dedicated region has the request's bin size, so that the same
     * request finds it again once it is freed and cached; near the limit,
     * the request's exact size. */
    bool dedicated = a->grow_own || exact > rs / 2 || need > room;
    if (dedicated) {
        rs = need > room ? exact : need;
    } else {
        if (rs > room)
            rs = room;
        size_t fr, total;
        if (a->be.mem_info && a->be.mem_info(a->be.ctx, &fr, &total) == 0 &&
            align_down(a, fr) >= need && rs > align_down(a, fr))
            rs = align_down(a, fr);
    }
    /* Refused: halve down to what the request needs, and as a last resort
     * its exact aligned size (the runtime may have room for the request but
     * not for a whole region, nor for the request's size class). */
    uintptr_t addr = 0;
    size_t min = dedicated ? exact : need;
    int rc;
    while ((rc = reserve_shared(a, rs, &addr)) != 0) {
        if (rc < 0) {
            a->reserve_error = -rc; /* not a lack of room: smaller will not help */
            return NIL;
        }
        if (rs > min) {
            rs = align_down(a, rs / 2);
            if (rs < min)
                rs = min;
        } else if (rs > exact) {
            rs = exact;
        } else {
            return NIL;
        }
    }
    if (rs < need)
        dedicated = true;

    uint32_t r = a->free_region;
    region *g = &a->regions[r];
    a->free_region = g->empty_next;
    uint32_t i = node_take(a);
    *g = (region){ .base = addr, .size = rs, .first = i, .empty_prev = NIL, .empty_next = NIL,
                   .dedicated = dedicated, .empty = false, .in_use = true };
    a->nodes[i] = (node){ .off = 0, .units = (uint32_t)(rs >> a->shift), .addr_prev = NIL,
                          .addr_next = NIL, .bin_prev = NIL, .bin_next = NIL,
                          .rs = r | (uint32_t)NODE_FREE << RS_STATE_SHIFT };
    uint32_t pos = shim_region_upper(a, addr);
    memmove(&a->sorted[pos + 1], &a->sorted[pos], (a->nsorted - pos) * sizeof *a->sorted);
    a->sorted[pos] = r;
    a->nsorted++;
    a->c.reserved_bytes += rs;
    if (a->c.reserved_bytes > a->c.peak_reserved_bytes)
        a->c.peak_reserved_bytes = a->c.reserved_bytes;
    a->c.regions++;
    a->c.regions_reserved++;
    return i;
}
