/* The quick lists. A freed block of a size class's exact size, up to
 * QUICK_MAX_UNITS, goes on a LIFO list of its class instead of merging,
 * and an allocation of that class takes it back first: neither touches a
 * neighbour's node nor a bin link, the misses that are most of a free and
 * an allocation at a million live blocks (programs that allocate the same
 * tensor shapes over and over hit these lists nearly every time). Cached
 * blocks count as free bytes but stay out of the bins, so they are kept
 * few: at most QUICK_DEPTH a class and 1/QUICK_FRACTION of the bytes in
 * use (a free over that merges a cached block too, so the lists shrink
 * with the program's use), and every one is merged (quick_flush,
 * arena.c) before a request finds nothing that fits, before a region is
 * reserved, and before a trim: the lists never cost a region. Placement stays what
 * merging would give (walls of cached blocks cost the classic trace 5-7
 * points of fragmentation): a block next to a free one is not cached
 * (RS_PREV_FREE, RS_NEXT_FREE), a free next to cached blocks merges them
 * (merge_freed, arena.c), and a request takes a cached block of a class
 * below the free block it found (alloc_block, arena.c).
 *
 * Guarded by: the owner's allocator lock, like every arena record.
 * Never: merges (arena.c does; these only file and take blocks).
 * A header included by arena.c alone: a quick hit is the whole of the
 * common allocation and free, so these stay in that translation unit;
 * `static inline` or plain `static` as when they were written in
 * arena.c, so that the compiler inlines the same ones. */
#ifndef SHIM_QUICKLIST_H
#define SHIM_QUICKLIST_H

#include "arena_layout.h"

#ifndef QUICK_DEPTH
#define QUICK_DEPTH 64
#endif
#ifndef QUICK_FRACTION
#define QUICK_FRACTION 16
#endif
/* Below this many live blocks the nodes stay in cache: the lists save no
 * miss there, their branches go either way, and a block freed is where
 * the next requests should look first (measured at 10,000 live blocks:
 * from 5% slower to 5% faster by trace, and the classic 64-size trace's
 * fragmentation 1.0490 -> 1.0655). */
#define QUICK_FROM_LIVE 65536

/* The last block freed to quick list `b`, or NIL. */
static inline uint32_t quick_take(shim_arena *a, uint32_t b)
{
    uint32_t i = a->quick_head[b];
    if (i == NIL)
        return NIL;
    node *n = &a->nodes[i];
    a->quick_head[b] = n->bin_next;
    if (n->bin_next == NIL)
        a->quick_map[b >> 6] &= ~(1ull << (b & 63));
    a->quick_depth[b]--;
    a->quick_bytes -= (uint64_t)n->units << a->shift;
    return i;
}

/* Takes cached block `i` off its quick list, wherever it is in it. */
static void quick_unlink(shim_arena *a, uint32_t i)
{
    node *n = &a->nodes[i];
    uint32_t b = bin_floor(n->units);
    if (a->quick_head[b] == i) {
        a->quick_head[b] = n->bin_next;
        if (n->bin_next == NIL)
            a->quick_map[b >> 6] &= ~(1ull << (b & 63));
    } else {
        a->nodes[n->bin_prev].bin_next = n->bin_next;
    }
    if (n->bin_next != NIL)
        a->nodes[n->bin_next].bin_prev = n->bin_prev;
    a->quick_depth[b]--;
    a->quick_bytes -= (uint64_t)n->units << a->shift;
}

/* The lowest quick class in [lo, hi) with a block, or NIL. */
static uint32_t quick_find(const shim_arena *a, uint32_t lo, uint32_t hi)
{
    if (hi > QUICK_BINS)
        hi = QUICK_BINS;
    for (uint32_t w = lo >> 6; lo < hi && w < QUICK_WORDS; w++, lo = w << 6) {
        uint64_t m = a->quick_map[w] & (~0ull << (lo & 63));
        if (m) {
            uint32_t c = (w << 6) | (uint32_t)__builtin_ctzll(m);
            return c < hi ? c : NIL;
        }
    }
    return NIL;
}

/* Files freed block `i` (node `n`, `bytes` long, already out of the used
 * bytes) on its quick list when it has a class's exact size and the lists
 * have room. */
static inline bool quick_put(shim_arena *a, uint32_t i, node *n, size_t bytes)
{
    uint32_t u = n->units;
    if (a->live_blocks < a->quick_from || u > QUICK_MAX_UNITS)
        return false;
    uint32_t b = bin_floor(u);
    if (bin_size(b) != u || (n->rs & (RS_PREV_FREE | RS_NEXT_FREE)) ||
        a->quick_depth[b] >= QUICK_DEPTH ||
        a->quick_bytes + bytes > a->c.used_bytes / QUICK_FRACTION ||
        a->regions[node_region(n)].dedicated)
        return false;
    set_state(n, NODE_QUICK);
    uint32_t head = a->quick_head[b];
    n->bin_next = head;
    if (head != NIL)
        a->nodes[head].bin_prev = i;
    a->quick_head[b] = i;
    a->quick_map[b >> 6] |= 1ull << (b & 63);
    a->quick_depth[b]++;
    a->quick_bytes += bytes;
    return true;
}

#endif
