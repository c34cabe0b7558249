/* The arena's records: the node of a block, the region, the arena itself,
 * and the node array's slots. Shared by the files of the region allocator
 * only (arena.c, freebins.h, quicklist.h, region.h and region.c,
 * arena_holes.c, arena_inspect.c); nothing outside them includes it.
 *
 * Guarded by: the owner's allocator lock (the device's shard lock, device_internal.h); nothing here locks.
 * Never: a device address dereferenced (all of this is host memory).
 * Everything here is static inline: the allocation and free paths
 * (arena.c) use it on every call, and a call across files would cost
 * what inlining saves. */
#ifndef SHIM_ARENA_LAYOUT_H
#define SHIM_ARENA_LAYOUT_H

#include "arena.h"
#include "bins.h"
#include "hostmem.h"

#define NIL UINT32_MAX

/* Blocks and regions are at most 2^31 units (512 GiB at 256-byte
 * alignment), so that a node's size fits 32 bits and bin arithmetic never
 * overflows; no device has more memory than that. */
#define MAX_UNITS ((uint64_t)1 << 31)

/* NODE_QUICK: freed, unmerged, on its size's quick list (quicklist.h). */
enum { NODE_UNUSED = 0, NODE_FREE, NODE_LIVE, NODE_QUICK };

/* The quick lists' classes: the exact-size bins up to QUICK_MAX_UNITS
 * (quicklist.h says what the lists are; their sizes are here because the
 * arena holds the lists' heads). */
#define QUICK_MAX_LOG 12
#define QUICK_MAX_UNITS (1u << QUICK_MAX_LOG)
#define QUICK_BINS ((((QUICK_MAX_LOG) - SL_BITS + 1) << SL_BITS) + 1)
#define QUICK_WORDS ((QUICK_BINS + 63) / 64)
_Static_assert(QUICK_MAX_LOG >= SL_BITS, "quick classes are above the exact-size bins");

/* 32 bytes, so that two nodes share a cache line and none straddles two:
 * a free touches a node and its neighbours at random, and these misses are
 * most of its cost. A live block's node is also its hot record: the bin
 * links, which only a free block needs, hold the bytes the program asked
 * for (as the slack below the block's size) and the owner's two tags (the
 * stack ids), so a free reads what it must account from the line it has
 * to touch anyway, and the owner keeps 8 bytes a block apart, not 40. The
 * address is an offset in the region (regions are at most MAX_UNITS), so
 * that all of this fits. */
typedef struct node {
    uint32_t off;                  /* start, in units from its region's base */
    uint32_t units;                /* size in alignment units */
    uint32_t addr_prev, addr_next; /* neighbours in the region, NIL at its ends */
    /* Region (low 28 bits), the neighbour bits (RS_PREV_FREE,
     * RS_NEXT_FREE) and state (top 2), written whole: a bit-field store of
     * the state is a byte store, and a later load of the word then waits
     * for it (a failed store forward, measured at 8% of an allocation when
     * a code change let it reach the path). */
    uint32_t rs;
    union {
        /* NODE_FREE: its bin; NODE_QUICK: its quick list (bin_prev unused
         * at the head); bin_next chains NODE_UNUSED slots. */
        struct {
            uint32_t bin_prev, bin_next;
        };
        struct {                   /* NODE_LIVE */
            uint32_t slack;        /* block bytes - requested bytes */
            uint32_t tag[2];       /* the owner's (shim_arena_set_tags) */
        };
    };
} node;
_Static_assert(sizeof(node) == SHIM_ARENA_NODE_BYTES, "node layout");

#define RS_REGION_MASK 0x0fffffffu
/* The block before (after) this one may be free: set when it becomes
 * free, cleared when it is carved (the allocation that ends its freedom)
 * while the quick lists are in use, so a free decides whether its block
 * may wait on a quick list without reading a neighbour: never clear where
 * the neighbour is free, exact once the lists have been in use a while.
 * Kept for live and cached blocks; a free block's carve rewrites its own. */
#define RS_PREV_FREE (1u << 28)
#define RS_NEXT_FREE (1u << 29)
#define RS_STATE_SHIFT 30

static inline uint32_t node_region(const node *n)
{
    return n->rs & RS_REGION_MASK;
}

static inline unsigned node_state(const node *n)
{
    return n->rs >> RS_STATE_SHIFT;
}

static inline void set_state(node *n, unsigned state)
{
    n->rs = (n->rs & ~(3u << RS_STATE_SHIFT)) | (uint32_t)state << RS_STATE_SHIFT;
}

typedef struct region {
    uintptr_t base;
    size_t size;
    uint32_t first;                /* node at base: merges keep the lower node */
    uint32_t empty_prev, empty_next; /* list of cached empty regions */
    bool dedicated, empty, in_use;
    /* An IPC handle names it (shim_arena_export): its one block is alone
     * in it, and once that block is freed it goes back to the runtime at
     * once, never to another owner. */
    bool exported;
} region;

struct shim_arena {
    shim_arena_hint hint;          /* first: shim_arena_prefetch reads it (arena.h) */
    shim_region_backend be;
    unsigned shift;                /* log2(alignment) */
    size_t limit;
    shim_arena_pool *pool;         /* shared with the device's other arenas, or NULL */
    size_t fixed_region;           /* 0 = adaptive */
    size_t capacity;               /* 0 until first asked */

    uint64_t fl_map;
    uint64_t sl_map[FL_COUNT];
    uint32_t heads[BIN_COUNT];

    uint32_t quick_head[QUICK_BINS];   /* NIL-terminated through bin_next */
    uint16_t quick_depth[QUICK_BINS];
    uint64_t quick_map[QUICK_WORDS];   /* non-empty quick lists */
    uint64_t quick_bytes;
    uint32_t live_blocks;
    uint32_t quick_from;               /* QUICK_FROM_LIVE unless set */

    node *nodes;                   /* hint.nodes too */
    uint32_t nodes_cap, nodes_used, free_slot;
    /* The block of the last free, whose merge with its neighbours waits
     * for the arena's next call (NIL: none): the free only starts loading
     * the neighbours' lines, which are there by then (merge_last_free). Its
     * node stays NODE_LIVE meanwhile, so no neighbour merges with it, and
     * its bytes already count as freed. */
    uint32_t last_free;

    region *regions;
    uint32_t regions_cap, free_region;
    uint32_t *sorted;              /* region ids by base address */
    uint32_t nsorted;
    uint32_t empty_head;           /* cached empty regions */

    shim_arena_counters c;
    int reserve_error;             /* set by shim_region_grow: the backend's non-OOM error */
    bool grow_own;                 /* shim_region_grow: a region of the request's exact size */
};

/* Node `i` is a live block: NODE_LIVE, and not the last free's block
 * whose merge is still to come (merge_last_free). */
static inline bool is_live(const shim_arena *a, uint32_t i)
{
    return i < a->nodes_used && node_state(&a->nodes[i]) == NODE_LIVE && i != a->last_free;
}

static inline uintptr_t node_addr(const shim_arena *a, const node *n)
{
    return a->regions[node_region(n)].base + ((uintptr_t)n->off << a->shift);
}

static inline size_t align_down(const shim_arena *a, size_t x)
{
    return x & ~(((size_t)1 << a->shift) - 1);
}

/* ---- node slots ---------------------------------------------------- */

/* Makes sure `k` slots can be taken without failing. */
static inline bool nodes_reserve(shim_arena *a, uint32_t k)
{
    if (a->free_slot != NIL && k <= 1)
        return true;
    if (a->nodes_used + k <= a->nodes_cap)
        return true;
    uint32_t cap = a->nodes_cap ? a->nodes_cap : 1024;
    while (cap < a->nodes_used + k) {
        if (cap > UINT32_MAX / 2)
            return false;
        cap *= 2;
    }
    /* Page aligned, so that a node never straddles two lines; grown in
     * place by the kernel (hostmem.h). */
    node *nn = shim_hostmem_grow(a->nodes, (size_t)a->nodes_cap * sizeof *nn,
                                 (size_t)cap * sizeof *nn);
    if (!nn)
        return false;
    a->nodes = nn;
    a->hint.nodes = nn;
    a->nodes_cap = cap;
    return true;
}

static inline uint32_t node_take(shim_arena *a)
{
    uint32_t i = a->free_slot;
    if (i != NIL)
        a->free_slot = a->nodes[i].bin_next;
    else
        i = a->nodes_used++;
    return i;
}

static inline void node_drop(shim_arena *a, uint32_t i)
{
    set_state(&a->nodes[i], NODE_UNUSED);
    a->nodes[i].bin_next = a->free_slot;
    a->free_slot = i;
}

static inline void add_used(shim_arena *a, uint64_t n)
{
    a->c.used_bytes += n;
    if (a->c.used_bytes > a->c.peak_used_bytes)
        a->c.peak_used_bytes = a->c.used_bytes;
}

#endif
