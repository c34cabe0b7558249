/* Regions: what an arena reserves from the runtime and suballocates.
 * The region-size policy, the address-sorted index of regions, the list
 * of cached empty regions, and giving a region back (region.c).
 *
 * Guarded by: the owner's allocator lock, like every arena record.
 * Never: touches the bins or the quick lists (arena.c takes a region's
 * node out of its bin before releasing it). */
#ifndef SHIM_REGION_H
#define SHIM_REGION_H

#include "arena_layout.h"

/* Empty regions kept for reuse (the one that became empty last). */
#define KEEP_EMPTY_REGIONS 1

/* Position of the first region whose base is > addr. */
static inline uint32_t shim_region_upper(const shim_arena *a, uintptr_t addr)
{
    uint32_t lo = 0, hi = a->nsorted;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a->regions[a->sorted[mid]].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Marks region `r` empty (its one node spans it: cached for reuse) or no
 * longer empty. Here, and static: the allocation path calls it when it
 * takes a whole empty region, and a call to a leaf of its own file lets
 * the compiler keep the caller's registers across it, where a call to
 * another file costs alloc_block spills on every call (2 instructions a
 * pair by callgrind). Not inline: as when it was in arena.c, the
 * compiler keeps it out of line. */
static void shim_region_set_empty(shim_arena *a, uint32_t r, bool empty)
{
    region *g = &a->regions[r];
    if (g->empty == empty)
        return;
    g->empty = empty;
    if (empty) {
        g->empty_prev = NIL;
        g->empty_next = a->empty_head;
        if (a->empty_head != NIL)
            a->regions[a->empty_head].empty_prev = r;
        a->empty_head = r;
        a->c.empty_regions++;
        a->c.empty_bytes += g->size;
    } else {
        if (g->empty_prev != NIL)
            a->regions[g->empty_prev].empty_next = g->empty_next;
        else
            a->empty_head = g->empty_next;
        if (g->empty_next != NIL)
            a->regions[g->empty_next].empty_prev = g->empty_prev;
        a->c.empty_regions--;
        a->c.empty_bytes -= g->size;
    }
}

/* Gives region `r` back to the runtime; `n` is its single free node,
 * already out of its bin. */
void shim_region_release(shim_arena *a, uint32_t r, uint32_t n);
/* Reserves a region able to hold `need` bytes (bin-rounded) or at least
 * `exact` (aligned) bytes; returns its single free node (not in a bin),
 * or NIL, with a->reserve_error set when the runtime failed for a reason
 * other than room. */
uint32_t shim_region_grow(shim_arena *a, size_t need, size_t exact);

#endif
