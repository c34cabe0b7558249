/* Inspection of an arena's insides, for the tests and the benchmarks
 * only: never linked into libspyreshim.so (shim/alloc/meson.build builds
 * it as a library of its own, alloc_inspect, which only test and bench
 * programs link; tests/integration/test_exports.py checks the product).
 *
 * Guarded by: the owner's allocator lock, like every arena call.
 * Never: changes what the arena holds (set_quick_from only moves the
 * threshold of the quick lists, before the first allocation; check only
 * finishes the merge a query would). */
#include "arena_inspect.h"
#include "arena_layout.h"

void shim_arena_set_quick_from(shim_arena *a, uint32_t live_blocks)
{
    a->quick_from = live_blocks;
}

uintptr_t shim_arena_block_addr(const shim_arena *a, uint32_t i)
{
    return is_live(a, i) ? node_addr(a, &a->nodes[i]) : 0;
}

size_t shim_arena_meta_bytes(const shim_arena *a)
{
    return sizeof *a + shim_hostmem_size((size_t)a->nodes_cap * sizeof *a->nodes) +
           (size_t)a->regions_cap * (sizeof *a->regions + sizeof *a->sorted);
}

const char *shim_arena_check(shim_arena *a)
{
    /* Merges the last free's block first (what every query does). */
    shim_arena_counters c;
    shim_arena_get_counters(a, &c);
    /* Exact only when every carve has kept them (the lists always on). */
    bool exact = a->quick_from == 0;
    uint64_t cached = 0;
    for (uint32_t k = 0; k < a->nsorted; k++) {
        const region *g = &a->regions[a->sorted[k]];
        uint64_t off = 0;
        uint32_t prev = NIL;
        for (uint32_t i = g->first; i != NIL; prev = i, i = a->nodes[i].addr_next) {
            const node *n = &a->nodes[i];
            if (n->addr_prev != prev || n->off != off || node_region(n) != a->sorted[k])
                return "a region's blocks do not chain";
            off += n->units;
            unsigned st = node_state(n);
            bool pf = prev != NIL && node_state(&a->nodes[prev]) == NODE_FREE;
            bool nf = n->addr_next != NIL && node_state(&a->nodes[n->addr_next]) == NODE_FREE;
            if (st == NODE_FREE && n->addr_next != NIL &&
                node_state(&a->nodes[n->addr_next]) != NODE_LIVE)
                return "a free block touches a free or cached one";
            if (st == NODE_QUICK && (pf || nf))
                return "a cached block touches a free one";
            if (st != NODE_FREE && ((pf && !(n->rs & RS_PREV_FREE)) || (nf && !(n->rs & RS_NEXT_FREE))))
                return "a block's neighbour bits miss a free neighbour";
            if (st != NODE_FREE && exact &&
                (!!(n->rs & RS_PREV_FREE) != pf || !!(n->rs & RS_NEXT_FREE) != nf))
                return "a block's neighbour bits are wrong";
            if (st == NODE_QUICK)
                cached += (uint64_t)n->units << a->shift;
        }
        if (off << a->shift != g->size)
            return "a region's blocks do not cover it";
    }
    return cached == a->quick_bytes ? NULL : "the quick lists' bytes are wrong";
}
