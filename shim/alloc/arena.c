/* The region allocator: regions reserved from a runtime through a backend,
 * suballocated into blocks with O(1) two-level size-class bins.
 *
 * Owns: the node array (one node per block, free, cached or live,
 * addressed by a uint32 index), the bins, the quick lists, the regions and
 * their address-sorted index.
 * Guarded by: the owner's allocator lock (device.c); nothing here locks.
 * Never: dereferences a device address (all metadata is host memory), or
 * calls back into the shim (the backend is the only way out).
 *
 * Bins. Sizes are counted in units of the backend's alignment. A size u
 * below SL_COUNT units has a bin of its own; above, a bin is a power-of-two
 * range [2^e, 2^(e+1)) split into SL_COUNT equal sub-bins, so a bin's lower
 * bound is within 1/SL_COUNT of any size in it. Every request is rounded up
 * to the lower bound of the next bin, so that any free block in that bin or
 * above fits (no search inside a bin) and so that the blocks carved out come
 * in a few shared sizes, which merge and get reused well. A bitmap of the
 * first-level ranges and one bitmap of sub-bins per range find the smallest
 * non-empty fitting bin with two count-trailing-zeros.
 *
 * Free merges both address neighbours when they are free (or waits whole
 * on a quick list: see "Quick lists" below); a node spanning
 * its whole region (no neighbours) means the region is empty, in O(1). The
 * merge of the last freed block waits for the arena's next call
 * (arena_settle), the free only starting its neighbours' lines loading.
 *
 * Region-size policy (see docs/allocator.md, "Regions"):
 * - The capacity is the runtime's total (backend mem_info) capped by the
 *   limit. The base region size is capacity/64 rounded down to a power of
 *   two, clamped to [2 MiB, 64 MiB]; once more is reserved, a new region is
 *   reserved/REGION_GROWTH_DIV (64) so the number of regions grows slowly
 *   while the slack in the last region stays under 2% of the total.
 * - Sub-bins (SL_COUNT = 64) and the growth divisor were chosen by
 *   bench/run.sh: 32 sub-bins or 1/16 growth cost 1-5 points of
 *   fragmentation on the benchmark traces; speed did not change.
 * - The last region shrinks to what the limit and the runtime's free memory
 *   leave, as long as the request still fits.
 * - A request above half the next region size, when no free block fits it,
 *   gets a dedicated region of its size class (its exact aligned size when
 *   that is all the limit leaves).
 * - When the runtime refuses a region, smaller ones (halving, down to the
 *   request itself) are tried before giving up.
 * - The region that became empty last, shared or dedicated, stays cached
 *   for reuse (a loop that frees and reallocates a large tensor then costs
 *   no runtime call); an older empty region is released at that moment
 *   (when the free that emptied the newer one settles: arena_settle).
 *   shim_arena_trim releases cached ones (the owner calls it under
 *   pressure), and a request that cannot get a new region releases them and
 *   tries again before failing.
 * Locks, their order and fork: docs/locking.md.
 */
#include "arena.h"
#include "bins.h"
#include "hostmem.h"

#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

#define MIB ((size_t)1 << 20)
#define REGION_MIN (2 * MIB)
#define REGION_BASE_MAX (64 * MIB)
#ifndef REGION_GROWTH_DIV
#define REGION_GROWTH_DIV 64
#endif
#define KEEP_EMPTY_REGIONS 1
/* Blocks and regions are at most 2^31 units (512 GiB at 256-byte
 * alignment), so that a node's size fits 32 bits and bin arithmetic never
 * overflows; no device has more memory than that. */
#define MAX_UNITS ((uint64_t)1 << 31)

/* NODE_QUICK: freed, unmerged, on its size's quick list (see below). */
enum { NODE_UNUSED = 0, NODE_FREE, NODE_LIVE, NODE_QUICK };

/* Quick lists. A freed block of a size class's exact size, up to
 * QUICK_MAX_UNITS, goes on a LIFO list of its class instead of merging,
 * and an allocation of that class takes it back first: neither touches a
 * neighbour's node nor a bin link, the misses that are most of a free and
 * an allocation at a million live blocks (programs that allocate the same
 * tensor shapes over and over hit these lists nearly every time). Cached
 * blocks count as free bytes but stay out of the bins, so they are kept
 * few: at most QUICK_DEPTH a class and 1/QUICK_FRACTION of the bytes in
 * use (a free over that merges a cached block too, so the lists shrink
 * with the program's use), and every one is merged (quick_flush) before a
 * request finds nothing that fits, before a region is reserved, and
 * before a trim: the lists never cost a region. Placement stays what
 * merging would give (walls of cached blocks cost the classic trace 5-7
 * points of fragmentation): a block next to a free one is not cached
 * (RS_PREV_FREE, RS_NEXT_FREE), a free next to cached blocks merges them
 * (merge_freed), and a request takes a cached block of a class below the
 * free block it found (alloc_block). */
#define QUICK_MAX_LOG 12
#define QUICK_MAX_UNITS (1u << QUICK_MAX_LOG)
#define QUICK_BINS ((((QUICK_MAX_LOG) - SL_BITS + 1) << SL_BITS) + 1)
#define QUICK_WORDS ((QUICK_BINS + 63) / 64)
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
    /* A block freed by the last free whose merge with its neighbours waits
     * for the arena's next call (NIL: none): the free only starts loading
     * the neighbours' lines, which are there by then (arena_settle). Its
     * node stays NODE_LIVE meanwhile, so no neighbour merges with it, and
     * its bytes already count as freed. */
    uint32_t unsettled;

    region *regions;
    uint32_t regions_cap, free_region;
    uint32_t *sorted;              /* region ids by base address */
    uint32_t nsorted;
    uint32_t empty_head;           /* cached empty regions */

    shim_arena_counters c;
    int reserve_error;             /* set by grow: the backend's non-OOM error */
};

/* Node `i` is a live block: NODE_LIVE, and not the last free's block
 * whose merge is still to come (arena_settle). */
static inline bool is_live(const shim_arena *a, uint32_t i)
{
    return i < a->nodes_used && node_state(&a->nodes[i]) == NODE_LIVE && i != a->unsettled;
}

static inline uintptr_t node_addr(const shim_arena *a, const node *n)
{
    return a->regions[node_region(n)].base + ((uintptr_t)n->off << a->shift);
}

/* ---- bins ---------------------------------------------------------- */

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

/* ---- node slots ---------------------------------------------------- */

/* Makes sure `k` slots can be taken without failing. */
static bool nodes_reserve(shim_arena *a, uint32_t k)
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

static uint32_t node_take(shim_arena *a)
{
    uint32_t i = a->free_slot;
    if (i != NIL)
        a->free_slot = a->nodes[i].bin_next;
    else
        i = a->nodes_used++;
    return i;
}

static void node_drop(shim_arena *a, uint32_t i)
{
    set_state(&a->nodes[i], NODE_UNUSED);
    a->nodes[i].bin_next = a->free_slot;
    a->free_slot = i;
}

/* ---- counters ------------------------------------------------------ */

static inline void add_used(shim_arena *a, uint64_t n)
{
    a->c.used_bytes += n;
    if (a->c.used_bytes > a->c.peak_used_bytes)
        a->c.peak_used_bytes = a->c.used_bytes;
}

static void set_empty(shim_arena *a, uint32_t r, bool empty)
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

/* A pool's arenas check the limit against what all of them hold: the
 * share is taken before the backend is asked (another arena may be asking
 * at the same time) and given back when refused or released. */
static bool pool_take(shim_arena *a, size_t n)
{
    if (!a->pool)
        return true;
    uint64_t cur = atomic_load_explicit(&a->pool->reserved, memory_order_relaxed);
    do {
        if (a->limit && cur + n > a->limit)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&a->pool->reserved, &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

/* After a region was reserved: the pool's peak counts only what the
 * runtime gave. */
static void pool_note_peak(shim_arena *a, size_t n)
{
    if (!a->pool)
        return;
    uint64_t now = atomic_fetch_add_explicit(&a->pool->held, n, memory_order_relaxed) + n;
    uint64_t peak = atomic_load_explicit(&a->pool->peak_reserved, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&a->pool->peak_reserved, &peak, now,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

static void pool_give(shim_arena *a, size_t n)
{
    if (a->pool)
        atomic_fetch_sub_explicit(&a->pool->reserved, n, memory_order_relaxed);
}

/* A region of the pool's went back to the runtime. */
static void pool_release(shim_arena *a, size_t n)
{
    if (a->pool) {
        atomic_fetch_sub_explicit(&a->pool->held, n, memory_order_relaxed);
        pool_give(a, n);
    }
}

/* The backend's reserve, within the pool's share: a share the pool cannot
 * give is a refusal for lack of room, like the runtime's. */
static int reserve_shared(shim_arena *a, size_t size, uintptr_t *addr)
{
    if (!pool_take(a, size))
        return 1;
    int rc = a->be.reserve(a->be.ctx, size, addr);
    if (rc != 0)
        pool_give(a, size);
    else
        pool_note_peak(a, size);
    return rc;
}

/* ---- regions ------------------------------------------------------- */

/* Position of the first region whose base is > addr. */
static uint32_t sorted_upper(const shim_arena *a, uintptr_t addr)
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
static void region_release(shim_arena *a, uint32_t r, uint32_t n)
{
    region *g = &a->regions[r];
    set_empty(a, r, false);
    node_drop(a, n);
    uint32_t pos = sorted_upper(a, g->base) - 1;
    memmove(&a->sorted[pos], &a->sorted[pos + 1], (a->nsorted - pos - 1) * sizeof *a->sorted);
    a->nsorted--;
    /* Out of the pool first: once the runtime has the region back,
     * another arena may get it, and the pool's peak must not count it
     * twice. */
    pool_release(a, g->size);
    a->be.release(a->be.ctx, g->base, g->size);
    a->c.reserved_bytes -= g->size;
    a->c.regions--;
    a->c.regions_released++;
    g->in_use = false;
    g->empty_next = a->free_region;
    a->free_region = r;
}

/* Releases cached empty region r (its one node is in a bin); returns bytes. */
static size_t release_cached(shim_arena *a, uint32_t r)
{
    uint32_t n = a->regions[r].first;
    size_t sz = a->regions[r].size;
    bin_remove(a, n);
    region_release(a, r, n);
    return sz;
}

static size_t align_down(const shim_arena *a, size_t x)
{
    return x & ~(((size_t)1 << a->shift) - 1);
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
    size_t grow = (size_t)(a->c.reserved_bytes / REGION_GROWTH_DIV);
    grow = (grow + REGION_MIN - 1) & ~(REGION_MIN - 1);
    return align_down(a, grow > base ? grow : base);
}

/* Reserves a region able to hold `need` bytes (bin-rounded) or at least
 * `exact` (aligned) bytes; inserts its single free node and returns it
 * (not in a bin), or NIL. */
static uint32_t grow(shim_arena *a, size_t need, size_t exact)
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
    bool dedicated = exact > rs / 2 || need > room;
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
    uint32_t pos = sorted_upper(a, addr);
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

/* ---- public -------------------------------------------------------- */

shim_arena *shim_arena_create(const shim_region_backend *be, size_t limit, size_t region_size)
{
    if (!be || !be->reserve || !be->release || be->alignment == 0 ||
        (be->alignment & (be->alignment - 1)) != 0)
        return NULL;
    shim_arena *a = shim_hostmem_lines(sizeof *a);
    if (!a)
        return NULL;
    a->be = *be;
    a->shift = (unsigned)__builtin_ctzll(be->alignment);
    a->limit = limit ? align_down(a, limit) : 0;
    if (region_size) {
        a->fixed_region = align_down(a, region_size);
        if (a->fixed_region == 0)
            a->fixed_region = be->alignment;
    }
    for (uint32_t b = 0; b < BIN_COUNT; b++)
        a->heads[b] = NIL;
    for (uint32_t b = 0; b < QUICK_BINS; b++)
        a->quick_head[b] = NIL;
    a->quick_from = QUICK_FROM_LIVE;
    a->free_slot = NIL;
    a->unsettled = NIL;
    a->free_region = NIL;
    a->empty_head = NIL;
    return a;
}

void shim_arena_set_pool(shim_arena *a, shim_arena_pool *pool)
{
    a->pool = pool;
}

void shim_arena_set_quick_from(shim_arena *a, uint32_t live_blocks)
{
    a->quick_from = live_blocks;
}

void shim_arena_destroy(shim_arena *a)
{
    if (!a)
        return;
    for (uint32_t k = 0; k < a->nsorted; k++) {
        region *g = &a->regions[a->sorted[k]];
        pool_release(a, g->size);
        a->be.release(a->be.ctx, g->base, g->size);
    }
    free(a->sorted);
    free(a->regions);
    shim_hostmem_free(a->nodes, (size_t)a->nodes_cap * sizeof *a->nodes);
    free(a);
}

/* Takes `take` units from the start of free node i (already out of its bin). */
static inline __attribute__((always_inline)) void carve(shim_arena *a, uint32_t i, uint32_t take)
{
    node *n = &a->nodes[i];
    uint32_t rest = n->units - take;
    if (rest > 0) {
        uint32_t j = node_take(a);
        n = &a->nodes[i];
        node *m = &a->nodes[j];
        m->off = n->off + take;
        m->units = rest;
        m->addr_prev = i;
        m->addr_next = n->addr_next;
        m->rs = node_region(n) | (uint32_t)NODE_FREE << RS_STATE_SHIFT;
        if (n->addr_next != NIL) {
            a->nodes[n->addr_next].addr_prev = j;
            a->nodes[n->addr_next].rs |= RS_PREV_FREE;
        }
        n->addr_next = j;
        n->units = take;
        bin_insert(a, j);
    }
    /* A free block's neighbours are not free: the remainder is the only
     * free one now. */
    n->rs = node_region(n) | (rest > 0 ? RS_NEXT_FREE : 0) | (uint32_t)NODE_LIVE << RS_STATE_SHIFT;
    /* The blocks around learn that this one is not free, while the quick
     * lists are in use; below, their bits may say free where it is not
     * (a block then merges where it could have waited), and the two lines
     * are not touched: 4% of a pair at 10,000 live blocks. */
    if (a->live_blocks >= a->quick_from) {
        if (rest == 0 && n->addr_next != NIL)
            a->nodes[n->addr_next].rs &= ~RS_PREV_FREE;
        if (n->addr_prev != NIL)
            a->nodes[n->addr_prev].rs &= ~RS_NEXT_FREE;
    }
}

static inline void arena_settle(shim_arena *a);
static void quick_flush(shim_arena *a);
static void merge_freed(shim_arena *a, uint32_t i);

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

/* Live block `i` (NODE_LIVE), asked for as `size` bytes, goes to the
 * caller. */
static inline __attribute__((always_inline)) void
hand_out(shim_arena *a, uint32_t i, size_t size, uintptr_t *addr, uint32_t *node_out, size_t *taken)
{
    node *n = &a->nodes[i];
    size_t bytes = (size_t)n->units << a->shift;
    n->slack = (uint32_t)(bytes - size);
    n->tag[0] = n->tag[1] = 0;
    add_used(a, bytes);
    a->live_blocks++;
    *addr = node_addr(a, n);
    *node_out = i;
    *taken = bytes;
    /* After this allocation's own misses: the last free's merge, whose
     * lines have been loading since. */
    arena_settle(a);
}

static int alloc_block(shim_arena *a, size_t size, bool may_grow, uintptr_t *addr,
                       uint32_t *node_out, size_t *taken)
{
    uint64_t u = (size >> a->shift) + ((size & (((size_t)1 << a->shift) - 1)) != 0);
    if (u == 0)
        u = 1;
    if (u > MAX_UNITS)
        return -1;
    uint32_t b = bin_ceil(u);
    uint64_t need = bin_size(b);
    /* The requested size is kept as a 32-bit slack below the block's size
     * (node.slack): blocks whose rounding alone would not fit it (above
     * 256 GiB at 256-byte alignment) are not rounded. */
    if (need > MAX_UNITS || ((need - u) << a->shift) + ((size_t)1 << a->shift) > UINT32_MAX)
        need = u;
    /* (alloc_quick found the class's quick list empty.) */
    if (!nodes_reserve(a, 1))
        return -1;
    uint32_t i = bin_find(a, b);
    if (a->quick_bytes && b < QUICK_BINS) {
        /* A cached block of a class below the free block found is what
         * best fit would take, had it been merged: taken and carved as a
         * free block would be. */
        uint32_t c = quick_find(a, b + 1, i != NIL ? bin_floor(a->nodes[i].units) : BIN_COUNT);
        if (c != NIL) {
            i = quick_take(a, c);
            set_state(&a->nodes[i], NODE_FREE);
            carve(a, i, (uint32_t)need);
            /* The rest (there is one: the class is larger) is free and may
             * touch cached blocks after it, which a free block never does:
             * they merge into it. */
            uint32_t rest = a->nodes[i].addr_next;
            uint32_t after = a->nodes[rest].addr_next;
            if (after != NIL && node_state(&a->nodes[after]) == NODE_QUICK) {
                bin_remove(a, rest);
                merge_freed(a, rest);
            }
            goto taken;
        }
    }
    if (i == NIL && (a->unsettled != NIL || a->quick_bytes)) {
        /* The last free's block, merged, may be what fits; or blocks on
         * the quick lists, merged. */
        arena_settle(a);
        quick_flush(a);
        i = bin_find(a, b);
    }
    if (i != NIL) {
        bin_remove(a, i);
        node *n = &a->nodes[i];
        if (n->addr_prev == NIL && n->addr_next == NIL)
            set_empty(a, node_region(n), false);
    } else if (!may_grow) {
        return -1;
    } else {
        /* Nothing unsettled here (settled above): growth and trimming see
         * every free block and every empty region. */
        a->reserve_error = 0;
        i = grow(a, need << a->shift, u << a->shift);
        if (i == NIL && a->c.empty_bytes && !a->reserve_error) {
            shim_arena_trim(a, 0);
            i = grow(a, need << a->shift, u << a->shift);
        }
        if (i == NIL)
            return a->reserve_error ? a->reserve_error : -1;
        if (a->regions[node_region(&a->nodes[i])].dedicated)
            need = a->nodes[i].units;
    }
    carve(a, i, (uint32_t)need);
taken:
    hand_out(a, i, size, addr, node_out, taken);
    return 0;
}

/* The request of a class whose quick list has a block: the common one
 * once the lists are in use, apart from alloc_block so that it carries
 * only what it uses (alloc_block's register saves alone were a fifth of
 * it). False, touching nothing, otherwise. */
static inline bool alloc_quick(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node_out,
                               size_t *taken)
{
    if (!a->quick_bytes || size > ((size_t)QUICK_MAX_UNITS << a->shift))
        return false;
    uint32_t b = bin_ceil((size + ((size_t)1 << a->shift) - 1) >> a->shift);
    uint32_t i = quick_take(a, b);
    if (i == NIL)
        return false;
    set_state(&a->nodes[i], NODE_LIVE);
    hand_out(a, i, size, addr, node_out, taken);
    return true;
}

int shim_arena_alloc(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node_out, size_t *taken)
{
    if (alloc_quick(a, size, addr, node_out, taken))
        return 0;
    return alloc_block(a, size, true, addr, node_out, taken);
}

int shim_arena_alloc_fit(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node_out,
                         size_t *taken)
{
    if (alloc_quick(a, size, addr, node_out, taken))
        return 0;
    return alloc_block(a, size, false, addr, node_out, taken);
}

/* Block `hi` (out of its bin or list) joins block `lo` just before it. */
static inline void join(shim_arena *a, uint32_t lo, uint32_t hi)
{
    node *l = &a->nodes[lo], *h = &a->nodes[hi];
    l->units += h->units;
    l->addr_next = h->addr_next;
    if (h->addr_next != NIL)
        a->nodes[h->addr_next].addr_prev = lo;
    node_drop(a, hi);
}

/* Merges into free block `i` (node `n`) the run of cached blocks after
 * it, and files the block after the run as having a free neighbour. */
static __attribute__((noinline)) void absorb_cached_after(shim_arena *a, uint32_t i, node *n)
{
    uint32_t nx;
    while ((nx = n->addr_next) != NIL && node_state(&a->nodes[nx]) == NODE_QUICK) {
        quick_unlink(a, nx);
        join(a, i, nx);
    }
    if (nx != NIL)
        a->nodes[nx].rs |= RS_PREV_FREE;
}

/* The same before it: returns the block the run merged into (the lowest
 * one: merges keep the lower node). */
static __attribute__((noinline)) uint32_t absorb_cached_before(shim_arena *a, uint32_t i)
{
    node *n = &a->nodes[i];
    uint32_t pv;
    while ((pv = n->addr_prev) != NIL && node_state(&a->nodes[pv]) == NODE_QUICK) {
        quick_unlink(a, pv);
        set_state(&a->nodes[pv], NODE_FREE);
        join(a, pv, i);
        i = pv;
        n = &a->nodes[i];
    }
    if (pv != NIL)
        a->nodes[pv].rs |= RS_NEXT_FREE;
    return i;
}

/* The merge and filing of freed block `i` (NODE_LIVE, or NODE_QUICK off
 * its list). A free block never touches another free block nor a cached
 * one: a free neighbour (one at most each side, and nothing free or cached
 * beyond it) merges, and so does every cached block of a run next to it;
 * the live blocks that end up next to it learn that it is free. */
static void merge_freed(shim_arena *a, uint32_t i)
{
    node *n = &a->nodes[i];
    set_state(n, NODE_FREE);
    uint32_t nx = n->addr_next;
    if (nx != NIL) {
        node *m = &a->nodes[nx];
        unsigned st = node_state(m);
        if (st == NODE_FREE) {
            bin_remove(a, nx);
            join(a, i, nx);
        } else if (st == NODE_QUICK) {
            absorb_cached_after(a, i, n);
        } else {
            m->rs |= RS_PREV_FREE;
        }
    }
    uint32_t pv = n->addr_prev;
    if (pv != NIL) {
        node *p = &a->nodes[pv];
        unsigned st = node_state(p);
        if (st == NODE_FREE) {
            bin_remove(a, pv);
            join(a, pv, i);
            i = pv;
            n = p;
        } else if (st == NODE_QUICK) {
            i = absorb_cached_before(a, i);
            n = &a->nodes[i];
        } else {
            p->rs |= RS_NEXT_FREE;
        }
    }
    if (n->addr_prev == NIL && n->addr_next == NIL) {
        /* The region is empty: it stays cached, and older empty regions
         * beyond the cache's size go back to the runtime. */
        while (a->c.empty_regions >= KEEP_EMPTY_REGIONS && a->empty_head != NIL)
            release_cached(a, a->empty_head);
        set_empty(a, node_region(n), true);
    }
    bin_insert(a, i);
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

/* Merges one block of the quick lists (the last one of the lowest
 * non-empty class). False when they are empty. */
static bool quick_merge_one(shim_arena *a)
{
    for (uint32_t w = 0; w < QUICK_WORDS; w++) {
        if (a->quick_map[w]) {
            uint32_t i = quick_take(a, w * 64 + (uint32_t)__builtin_ctzll(a->quick_map[w]));
            merge_freed(a, i);
            return true;
        }
    }
    return false;
}

/* Merges every block of the quick lists. */
static void quick_flush(shim_arena *a)
{
    while (a->quick_bytes && quick_merge_one(a))
        ;
}

/* Finishes the last free (its merge), before anything that looks at free
 * blocks, regions or node states. */
static inline void arena_settle(shim_arena *a)
{
    uint32_t i = a->unsettled;
    if (i != NIL) {
        a->unsettled = NIL;
        merge_freed(a, i);
    }
}

static inline size_t free_live(shim_arena *a, uint32_t i, size_t *requested)
{
    if (!is_live(a, i)) {
        *requested = 0;
        return 0;
    }
    node *n = &a->nodes[i];
    size_t bytes = (size_t)n->units << a->shift;
    *requested = bytes - n->slack;
    a->c.used_bytes -= bytes;
    a->live_blocks--;
    if (quick_put(a, i, n, bytes))
        return bytes;
    /* The lists shrink with the bytes in use, a block for a block, and
     * are gone when nothing is, so that the regions show empty. */
    if (a->quick_bytes && a->quick_bytes > a->c.used_bytes / QUICK_FRACTION) {
        if (a->c.used_bytes == 0)
            quick_flush(a);
        else
            quick_merge_one(a);
    }
    /* The neighbours' lines start loading now; the merge that reads them
     * runs at the arena's next call (a likely miss each, at a million live
     * blocks, that would otherwise stall this free). */
    if (n->addr_prev != NIL)
        __builtin_prefetch(&a->nodes[n->addr_prev], 1);
    if (n->addr_next != NIL)
        __builtin_prefetch(&a->nodes[n->addr_next], 1);
    arena_settle(a);
    a->unsettled = i;
    return bytes;
}

size_t shim_arena_free_node(shim_arena *a, uint32_t i)
{
    size_t requested;
    return free_live(a, i, &requested);
}

size_t shim_arena_free_live(shim_arena *a, uint32_t i, size_t *requested)
{
    return free_live(a, i, requested);
}

enum shim_block_kind shim_arena_classify(shim_arena *a, uintptr_t addr,
                                         uintptr_t *region_base, size_t *region_size)
{
    arena_settle(a);
    uint32_t pos = sorted_upper(a, addr);
    if (pos == 0)
        return SHIM_ADDR_OUTSIDE;
    const region *g = &a->regions[a->sorted[pos - 1]];
    if (addr - g->base >= g->size)
        return SHIM_ADDR_OUTSIDE;
    if (region_base)
        *region_base = g->base;
    if (region_size)
        *region_size = g->size;
    for (uint32_t i = g->first; i != NIL; i = a->nodes[i].addr_next) {
        const node *n = &a->nodes[i];
        uintptr_t na = node_addr(a, n);
        if (addr - na < ((uintptr_t)n->units << a->shift)) {
            if (addr != na)
                return SHIM_ADDR_INTERIOR;
            return node_state(n) == NODE_LIVE ? SHIM_ADDR_LIVE_START : SHIM_ADDR_FREE_START;
        }
    }
    return SHIM_ADDR_INTERIOR; /* unreachable: the nodes tile the region */
}

bool shim_arena_contains(const shim_arena *a, uintptr_t addr)
{
    uint32_t pos = sorted_upper(a, addr);
    return pos > 0 && addr - a->regions[a->sorted[pos - 1]].base < a->regions[a->sorted[pos - 1]].size;
}

bool shim_arena_live_block_at(shim_arena *a, uintptr_t addr, uintptr_t *start)
{
    arena_settle(a);
    uint32_t pos = sorted_upper(a, addr);
    if (pos == 0)
        return false;
    const region *g = &a->regions[a->sorted[pos - 1]];
    if (addr - g->base >= g->size)
        return false;
    for (uint32_t i = g->first; i != NIL; i = a->nodes[i].addr_next) {
        const node *n = &a->nodes[i];
        uintptr_t na = node_addr(a, n);
        if (addr - na < ((uintptr_t)n->units << a->shift)) {
            *start = na;
            return node_state(n) == NODE_LIVE;
        }
    }
    return false;
}

size_t shim_arena_block_size(const shim_arena *a, uint32_t i)
{
    return i < a->nodes_used ? (size_t)a->nodes[i].units << a->shift : 0;
}

size_t shim_arena_trim(shim_arena *a, size_t keep)
{
    arena_settle(a);
    quick_flush(a);
    size_t released = 0;
    while (a->empty_head != NIL && a->c.empty_bytes > keep)
        released += release_cached(a, a->empty_head);
    return released;
}

uintptr_t shim_arena_block_addr(const shim_arena *a, uint32_t i)
{
    return is_live(a, i) ? node_addr(a, &a->nodes[i]) : 0;
}

void shim_arena_set_tags(shim_arena *a, uint32_t i, uint32_t t0, uint32_t t1)
{
    if (is_live(a, i)) {
        a->nodes[i].tag[0] = t0;
        a->nodes[i].tag[1] = t1;
    }
}

uint32_t shim_arena_tag(const shim_arena *a, uint32_t i, unsigned k)
{
    return is_live(a, i) && k < 2 ? a->nodes[i].tag[k] : 0;
}

size_t shim_arena_block_requested(const shim_arena *a, uint32_t i)
{
    if (!is_live(a, i))
        return 0;
    const node *n = &a->nodes[i];
    return ((size_t)n->units << a->shift) - n->slack;
}

size_t shim_arena_meta_bytes(const shim_arena *a)
{
    return sizeof *a + shim_hostmem_size((size_t)a->nodes_cap * sizeof *a->nodes) +
           (size_t)a->regions_cap * (sizeof *a->regions + sizeof *a->sorted);
}

void shim_arena_get_counters(shim_arena *a, shim_arena_counters *c)
{
    arena_settle(a);
    *c = a->c;
}

const char *shim_arena_check(shim_arena *a)
{
    arena_settle(a);
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

size_t shim_arena_limit(const shim_arena *a)
{
    return a->limit;
}
