/* The out-of-band region allocator: regions reserved from a runtime through
 * a backend, suballocated into blocks. All metadata lives in host memory;
 * the arena never dereferences a device address. Not thread-safe: the
 * owner (a device's shard, device_internal.h) serializes calls with the allocator lock. */
#ifndef SHIM_ARENA_H
#define SHIM_ARENA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

typedef struct shim_region_backend {
    void *ctx;
    /* Reserve `size` bytes. 0 and *addr set; positive when refused for lack
     * of room (a smaller size may still fit); negative, -(the runtime's
     * error), when the runtime failed for another reason (no driver, a stub
     * library): then no smaller size is tried either. */
    int (*reserve)(void *ctx, size_t size, uintptr_t *addr);
    void (*release)(void *ctx, uintptr_t addr, size_t size);
    /* Optional: false while a region must not go back (a CUDA stream
     * capture: the driver's free synchronizes); cached empty regions then
     * stay cached. Asked only when one is about to be released. */
    bool (*may_release)(void *ctx);
    /* The runtime's own view; nonzero on failure. */
    int (*mem_info)(void *ctx, size_t *free, size_t *total);
    size_t alignment;        /* power of two; every block is aligned to it */
} shim_region_backend;

typedef struct shim_arena shim_arena;

typedef struct shim_arena_counters {
    uint64_t reserved_bytes, used_bytes;           /* used = sum of block sizes handed out */
    uint64_t peak_reserved_bytes, peak_used_bytes;
    uint64_t regions, regions_reserved, regions_released;
    uint64_t empty_regions, empty_bytes;
} shim_arena_counters;

enum shim_block_kind {
    SHIM_ADDR_OUTSIDE = 0,   /* in no region: not ours */
    SHIM_ADDR_LIVE_START,    /* start of a live block */
    SHIM_ADDR_FREE_START,    /* start of a free block (double free) */
    SHIM_ADDR_INTERIOR,      /* inside a block, not at its start */
};

/* `limit` caps reserved bytes (0 = none); `region_size` 0 = adaptive. */
shim_arena *shim_arena_create(const shim_region_backend *be, size_t limit, size_t region_size);
/* Makes `a` count its regions in `pool` and check its limit against the
 * pool's total; before its first allocation. */
void shim_arena_set_pool(shim_arena *a, shim_arena_pool *pool);
/* Releases every region to the backend. */
void shim_arena_destroy(shim_arena *a);

/* Allocates a block of at least `size` (> 0) bytes. On success returns 0,
 * sets *addr, *node (the block's handle, for shim_arena_free_node) and
 * *block_bytes (bytes the block occupies, after rounding). Returns -1 when
 * no free block fits and a new region is refused by the limit or the
 * backend for lack of room; a positive value, the runtime's own error, when the backend
 * failed for another reason (not out-of-memory: no relief can help). */
int shim_arena_alloc(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node,
                     size_t *block_bytes);
/* The same from the free blocks the arena has: -1, and no region
 * reserved, when none fits. */
int shim_arena_alloc_fit(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node,
                         size_t *block_bytes);
/* The same in a region of its own, of the request's exact aligned size (a
 * cached empty region of that size, else a new one when `may_grow`): the
 * block can be exported (shim_arena_export). */
int shim_arena_alloc_own(shim_arena *a, size_t size, bool may_grow, uintptr_t *addr,
                         uint32_t *node, size_t *block_bytes);
/* Whether the live block starting at `addr` is alone in its region, which
 * starts there: then the region is marked exported (an IPC handle names
 * it: once the block is freed the region goes back to the runtime, never
 * to another block) and true. */
bool shim_arena_export(shim_arena *a, uintptr_t addr);
/* Frees a block by handle. Returns bytes it occupied. */
size_t shim_arena_free_node(shim_arena *a, uint32_t node);
/* The same, setting *requested to the size it was asked for (0 when
 * `node` is not a live block): one call where a free needs both. */
size_t shim_arena_free_live(shim_arena *a, uint32_t node, size_t *requested);
/* The size a live block was asked for (the `size` given to alloc: the
 * node keeps it, so the owner need not), or 0 when not a live block. */
size_t shim_arena_block_requested(const shim_arena *a, uint32_t node);
/* What shim_arena_prefetch reads: the arena's first member, so that the
 * prefetch is inline. Under the owner's lock. */
typedef struct shim_arena_hint {
    const void *nodes;
} shim_arena_hint;
#define SHIM_ARENA_NODE_BYTES 32

/* Starts loading the line of block `node`'s node, for a call on it soon
 * (free_path.c: the free it defers). A hint: `node` need not be valid. */
static inline void shim_arena_prefetch(const shim_arena *a, uint32_t node)
{
    const shim_arena_hint *h = (const shim_arena_hint *)(const void *)a;
    __builtin_prefetch((const char *)h->nodes + (size_t)node * SHIM_ARENA_NODE_BYTES, 1);
}
/* Two 32-bit words the owner keeps with a live block (alloc_path.c: its stack
 * ids), in the block's node; 0 until set, gone when the block is freed. */
void shim_arena_set_tags(shim_arena *a, uint32_t node, uint32_t t0, uint32_t t1);
uint32_t shim_arena_tag(const shim_arena *a, uint32_t node, unsigned k);
/* What `addr` is, for diagnostics of a pointer that is not in the live
 * table; *region_base and *region_size describe the region when it is in one. */
enum shim_block_kind shim_arena_classify(shim_arena *a, uintptr_t addr,
                                         uintptr_t *region_base, size_t *region_size);
/* Whether `addr` lies in one of the arena's regions: O(log regions). */
bool shim_arena_contains(const shim_arena *a, uintptr_t addr);
/* Whether `addr` lies inside a live block, and that block's start. Walks
 * the region's blocks: for address queries, not for the hot path. */
bool shim_arena_live_block_at(shim_arena *a, uintptr_t addr, uintptr_t *start);
/* Bytes the block `node` occupies (after rounding). */
size_t shim_arena_block_size(const shim_arena *a, uint32_t node);
/* Gives empty regions back to the runtime until at most `keep` bytes of
 * empty regions remain; returns the bytes released. */
size_t shim_arena_trim(shim_arena *a, size_t keep);
void shim_arena_get_counters(shim_arena *a, shim_arena_counters *c);
size_t shim_arena_limit(const shim_arena *a);
/* The largest hole (a run of bytes inside one region no live block holds)
 * and the sum of such bytes (arena_holes.c). O(blocks): for the
 * out-of-memory verdict only, with the owner's lock held. */
void shim_arena_holes(shim_arena *a, uint64_t *largest, uint64_t *free_bytes);

#endif
