/* The bins of free blocks: each free block is filed under the bin of its
 * size (bins.h, the size-class math), and a request finds the smallest
 * non-empty bin that fits it with two count-trailing-zeros: a bitmap of
 * the first-level ranges and one bitmap of sub-bins per range. Every
 * request is rounded up to the lower bound of the next bin (bin_ceil), so
 * any free block in that bin or above fits: no search inside a bin.
 *
 * Guarded by: the owner's allocator lock, like every arena record.
 * Never: touches a live or cached block (NODE_LIVE, NODE_QUICK) other than
 * to file it.
 * A header included by arena.c alone: the allocation and free paths call
 * these on every carve and merge, and they must stay in that file's
 * translation unit. Plain `static`, as when they were written in
 * arena.c, so that the compiler decides as it did then: bin_find
 * inlined, bin_insert and bin_remove (several callers each) out of
 * line. */
#ifndef SHIM_FREEBINS_H
#define SHIM_FREEBINS_H

#include "arena_layout.h"

static void bin_insert(shim_arena *a, uint32_t i)
{
    node *n = &a->nodes[i];
    uint32_t b = bin_floor(n->units);
    uint32_t head = a->heads[b];
    set_state(n, NODE_FREE);
    n->bin_prev = NIL;
    n->bin_next = head;
    if (head != NIL)
        a->nodes[head].bin_prev = i;
    a->heads[b] = i;
    a->fl_map |= 1ull << (b >> SL_BITS);
    a->sl_map[b >> SL_BITS] |= 1ull << (b & (SL_COUNT - 1));
}

static void bin_remove(shim_arena *a, uint32_t i)
{
    node *n = &a->nodes[i];
    if (n->bin_prev != NIL) {
        a->nodes[n->bin_prev].bin_next = n->bin_next;
    } else {
        uint32_t b = bin_floor(n->units);
        a->heads[b] = n->bin_next;
        if (n->bin_next == NIL) {
            uint32_t fl = b >> SL_BITS;
            a->sl_map[fl] &= ~(1ull << (b & (SL_COUNT - 1)));
            if (a->sl_map[fl] == 0)
                a->fl_map &= ~(1ull << fl);
        }
    }
    if (n->bin_next != NIL)
        a->nodes[n->bin_next].bin_prev = n->bin_prev;
}

/* The head of the smallest non-empty bin >= b, or NIL. */
static uint32_t bin_find(const shim_arena *a, uint32_t b)
{
    uint32_t fl = b >> SL_BITS, sl = b & (SL_COUNT - 1);
    if (fl >= FL_COUNT)
        return NIL;
    uint64_t m = a->sl_map[fl] & (~0ull << sl);
    if (m == 0) {
        if (fl + 1 >= FL_COUNT)
            return NIL;
        uint64_t f = a->fl_map & (~0ull << (fl + 1));
        if (f == 0)
            return NIL;
        fl = (uint32_t)__builtin_ctzll(f);
        m = a->sl_map[fl];
    }
    return a->heads[(fl << SL_BITS) | (uint32_t)__builtin_ctzll(m)];
}

#endif
