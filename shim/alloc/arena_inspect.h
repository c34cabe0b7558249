/* Inspection of an arena's insides (arena_inspect.c): for the tests and
 * the benchmarks only, in a library of its own (alloc_inspect) that the
 * product never links. */
#ifndef SHIM_ARENA_INSPECT_H
#define SHIM_ARENA_INSPECT_H

#include "arena.h"

/* Freed blocks wait on quick lists (quicklist.h) once the arena holds this
 * many live blocks (65,536 unless set): tests set 0, to have them at any
 * size. Before the first allocation. */
void shim_arena_set_quick_from(shim_arena *a, uint32_t live_blocks);
/* A live block's address, or 0 when `node` is not a live block. */
uintptr_t shim_arena_block_addr(const shim_arena *a, uint32_t node);
/* Host bytes the arena's own structures take (mapped, not all resident). */
size_t shim_arena_meta_bytes(const shim_arena *a);
/* Walks every block and checks the arena's invariants (blocks tile their
 * regions, no free block touches a free or cached one, the neighbour bits
 * of live and cached blocks never miss a free neighbour, and are exact
 * when quick lists are in use from 0 live blocks). NULL when they hold,
 * else what broke. O(blocks). */
const char *shim_arena_check(shim_arena *a);

#endif
