/* The free space of an arena as an out-of-memory verdict needs it
 * (arena.h: shim_arena_holes): the largest run of address space inside one
 * region that no live block holds (free blocks and freed blocks waiting on
 * the quick lists, which merge when taken), and all such bytes.
 *
 * Guarded by the owner's allocator lock (device.c holds the shard's lock);
 * nothing here locks. O(blocks): called on the failure path only, never on
 * an allocation or a free. */
#include "arena_layout.h"

void shim_arena_holes(shim_arena *a, uint64_t *largest, uint64_t *free_bytes)
{
    /* Settles the last free's merge first, as every query does. */
    shim_arena_counters c;
    shim_arena_get_counters(a, &c);
    uint64_t big = 0, sum = 0;
    for (uint32_t k = 0; k < a->nsorted; k++) {
        const region *g = &a->regions[a->sorted[k]];
        uint64_t run = 0;
        for (uint32_t i = g->first; i != NIL; i = a->nodes[i].addr_next) {
            const node *n = &a->nodes[i];
            if (node_state(n) == NODE_LIVE) {
                run = 0;
                continue;
            }
            uint64_t b = (uint64_t)n->units << a->shift;
            run += b;
            sum += b;
            if (run > big)
                big = run;
        }
    }
    *largest = big;
    *free_bytes = sum;
}
