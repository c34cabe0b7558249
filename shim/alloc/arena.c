/* The region allocator's blocks: allocation (a quick list's block, or a
 * free block found in the bins and carved), free (onto a quick list, or
 * merged with its free neighbours), and what the owner asks of a block.
 *
 * Owns: the hot paths. The records are arena_layout.h's, the bins of free
 * blocks freebins.h's, the quick lists quicklist.h's: headers of static
 * functions included here alone, so that a whole allocation and a whole
 * free stay one translation unit and inline what they did when all of it
 * was one file (callgrind's count of the interposed pair did not change:
 * docs/allocator.md, "Files"). Regions (policy, index, release) are
 * region.c's and the limit the arenas share is pool.c's: both off the hot
 * path.
 * Guarded by: the owner's allocator lock (the device's shard lock, device_internal.h); nothing here locks.
 * Never: dereferences a device address (all metadata is host memory), or
 * calls back into the shim (the backend is the only way out).
 *
 * Free merges both address neighbours when they are free (or waits whole
 * on a quick list: quicklist.h); a node spanning its whole region (no
 * neighbours) means the region is empty, in O(1). The merge of the last
 * freed block waits for the arena's next call (merge_last_free), the free
 * only starting its neighbours' lines loading.
 * Locks, their order and fork: docs/locking.md.
 */
#include "arena.h"
#include "arena_layout.h"
#include "freebins.h"
#include "pool.h"
#include "quicklist.h"
#include "region.h"

#include <stdlib.h>
#include <string.h>

/* ---- the arena ----------------------------------------------------- */

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
    a->last_free = NIL;
    a->free_region = NIL;
    a->empty_head = NIL;
    return a;
}

void shim_arena_set_pool(shim_arena *a, shim_arena_pool *pool)
{
    a->pool = pool;
}

void shim_arena_destroy(shim_arena *a)
{
    if (!a)
        return;
    for (uint32_t k = 0; k < a->nsorted; k++) {
        region *g = &a->regions[a->sorted[k]];
        shim_pool_release(a->pool, g->size);
        a->be.release(a->be.ctx, g->base, g->size);
    }
    free(a->sorted);
    free(a->regions);
    shim_hostmem_free(a->nodes, (size_t)a->nodes_cap * sizeof *a->nodes);
    free(a);
}

/* ---- allocation ---------------------------------------------------- */

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

static inline void merge_last_free(shim_arena *a);
static void quick_flush(shim_arena *a);
static void merge_freed(shim_arena *a, uint32_t i);

/* Live block `i` (NODE_LIVE), asked for as `size` bytes, goes to the
 * caller. */
static inline __attribute__((always_inline)) void
hand_out(shim_arena *a, uint32_t i, size_t size, uintptr_t *addr, uint32_t *node_out,
         size_t *block_bytes)
{
    node *n = &a->nodes[i];
    size_t bytes = (size_t)n->units << a->shift;
    n->slack = (uint32_t)(bytes - size);
    n->tag[0] = n->tag[1] = 0;
    add_used(a, bytes);
    a->live_blocks++;
    *addr = node_addr(a, n);
    *node_out = i;
    *block_bytes = bytes;
    /* After this allocation's own misses: the last free's merge, whose
     * lines have been loading since. */
    merge_last_free(a);
}

/* Free block `i` is a cached empty region made for a request of another
 * size class than `need` units. Such a region serves its own class only:
 * carved for a smaller request, its rest would be free memory only this
 * arena can use, pinned by one block, where the runtime alone would have
 * placed the next large request (tests/integration/test_capacity.py: a
 * 14 MiB region freed and carved for a 4.5 MiB block, four times over,
 * refused a 14 MiB request that the device alone served). */
static bool foreign_dedicated(const shim_arena *a, uint32_t i, uint64_t need)
{
    const node *n = &a->nodes[i];
    return n->addr_prev == NIL && n->addr_next == NIL &&
           a->regions[node_region(n)].dedicated && n->units != need;
}

static int alloc_block(shim_arena *a, size_t size, bool may_grow, uintptr_t *addr,
                       uint32_t *node_out, size_t *block_bytes)
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
            goto carved;
        }
    }
    if (i == NIL && (a->last_free != NIL || a->quick_bytes)) {
        /* The last free's block, merged, may be what fits; or blocks on
         * the quick lists, merged. */
        merge_last_free(a);
        quick_flush(a);
        i = bin_find(a, b);
    }
    if (i != NIL && foreign_dedicated(a, i, need))
        i = NIL;
    if (i != NIL) {
        bin_remove(a, i);
        node *n = &a->nodes[i];
        if (n->addr_prev == NIL && n->addr_next == NIL)
            shim_region_set_empty(a, node_region(n), false);
    } else if (!may_grow) {
        return -1;
    } else {
        /* No merge left for later here (done above): growth and trimming see
         * every free block and every empty region. The cached empty regions
         * go back first: nothing here fits in them, and where they sit the
         * runtime places the new region, as it would place the request
         * without the shim (a region kept aside would push every later one
         * past it). */
        a->reserve_error = 0;
        if (a->c.empty_bytes)
            shim_arena_trim(a, 0);
        i = shim_region_grow(a, need << a->shift, u << a->shift);
        if (i == NIL)
            return a->reserve_error ? a->reserve_error : -1;
        if (a->regions[node_region(&a->nodes[i])].dedicated)
            need = a->nodes[i].units;
    }
    carve(a, i, (uint32_t)need);
carved:
    hand_out(a, i, size, addr, node_out, block_bytes);
    return 0;
}

/* The request of a class whose quick list has a block: the common one
 * once the lists are in use, apart from alloc_block so that it carries
 * only what it uses (alloc_block's register saves alone were a fifth of
 * it). False, touching nothing, otherwise. */
static inline bool alloc_quick(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node_out,
                               size_t *block_bytes)
{
    if (!a->quick_bytes || size > ((size_t)QUICK_MAX_UNITS << a->shift))
        return false;
    uint32_t b = bin_ceil((size + ((size_t)1 << a->shift) - 1) >> a->shift);
    uint32_t i = quick_take(a, b);
    if (i == NIL)
        return false;
    set_state(&a->nodes[i], NODE_LIVE);
    hand_out(a, i, size, addr, node_out, block_bytes);
    return true;
}

int shim_arena_alloc(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node_out,
                     size_t *block_bytes)
{
    if (alloc_quick(a, size, addr, node_out, block_bytes))
        return 0;
    return alloc_block(a, size, true, addr, node_out, block_bytes);
}

int shim_arena_alloc_fit(shim_arena *a, size_t size, uintptr_t *addr, uint32_t *node_out,
                         size_t *block_bytes)
{
    if (alloc_quick(a, size, addr, node_out, block_bytes))
        return 0;
    return alloc_block(a, size, false, addr, node_out, block_bytes);
}

/* A block in a region of its own, of the request's exact aligned size
 * (a block that may be exported: an IPC handle names a whole region).
 * Never carved from a shared region; a cached empty region of exactly that
 * size is taken first (a loop that frees and allocates the same large
 * block then costs no runtime call), else a new one when `may_grow`. Off
 * the common path: the hooks call it for requests they chose. */
int shim_arena_alloc_own(shim_arena *a, size_t size, bool may_grow, uintptr_t *addr,
                         uint32_t *node_out, size_t *block_bytes)
{
    uint64_t u = (size >> a->shift) + ((size & (((size_t)1 << a->shift) - 1)) != 0);
    if (u == 0)
        u = 1;
    if (u > MAX_UNITS || ((size_t)u << a->shift) - size > UINT32_MAX)
        return -1;
    if (!nodes_reserve(a, 1))
        return -1;
    merge_last_free(a);
    size_t exact = (size_t)u << a->shift;
    uint32_t i = NIL;
    for (uint32_t r = a->empty_head; r != NIL; r = a->regions[r].empty_next) {
        if (a->regions[r].size == exact && !a->regions[r].exported) {
            i = a->regions[r].first;
            bin_remove(a, i);
            shim_region_set_empty(a, r, false);
            break;
        }
    }
    if (i == NIL) {
        if (!may_grow)
            return -1;
        a->reserve_error = 0;
        a->grow_own = true;
        i = shim_region_grow(a, exact, exact);
        if (i == NIL && a->c.empty_bytes && !a->reserve_error) {
            shim_arena_trim(a, 0);
            i = shim_region_grow(a, exact, exact);
        }
        a->grow_own = false;
        if (i == NIL)
            return a->reserve_error ? a->reserve_error : -1;
    }
    carve(a, i, a->nodes[i].units);
    hand_out(a, i, size, addr, node_out, block_bytes);
    return 0;
}

bool shim_arena_export(shim_arena *a, uintptr_t addr)
{
    merge_last_free(a);
    uint32_t pos = shim_region_upper(a, addr);
    if (pos == 0)
        return false;
    region *g = &a->regions[a->sorted[pos - 1]];
    if (addr != g->base || g->first == NIL)
        return false;
    node *n = &a->nodes[g->first];
    if (!is_live(a, g->first) || n->addr_prev != NIL || n->addr_next != NIL)
        return false;
    /* Dedicated: its block never waits on a quick list when freed
     * (quick_put), so the free merges and releases it (merge_freed). */
    g->exported = true;
    g->dedicated = true;
    return true;
}

/* Whether the backend lets a cached region go now (arena.h). */
static bool may_release(shim_arena *a)
{
    return !a->be.may_release || a->be.may_release(a->be.ctx);
}

/* Releases cached empty region r (its one node is in a bin); returns bytes. */
static size_t release_cached(shim_arena *a, uint32_t r)
{
    uint32_t n = a->regions[r].first;
    size_t sz = a->regions[r].size;
    if (!a->regions[r].exported) /* an exported one is in no bin (merge_freed) */
        bin_remove(a, n);
    shim_region_release(a, r, n);
    return sz;
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
        uint32_t r = node_region(n);
        if (a->regions[r].exported) {
            /* Another process may still map it: never another block's.
             * Back to the runtime now, or, where a release may not run now
             * (a stream capture), cached outside the bins, so that nothing
             * is carved from it, until one may (release_cached). */
            if (may_release(a)) {
                shim_region_release(a, r, i);
                return;
            }
            shim_region_set_empty(a, r, true);
            return;
        }
        /* The region is empty: it stays cached, and older empty regions
         * beyond the cache's size go back to the runtime. */
        while (a->c.empty_regions >= KEEP_EMPTY_REGIONS && a->empty_head != NIL &&
               may_release(a))
            release_cached(a, a->empty_head);
        shim_region_set_empty(a, r, true);
    }
    bin_insert(a, i);
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

/* Merges the last free's block with its neighbours (free_live left it
 * for now), before anything that looks at free blocks, regions or node
 * states. */
static inline void merge_last_free(shim_arena *a)
{
    uint32_t i = a->last_free;
    if (i != NIL) {
        a->last_free = NIL;
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
    merge_last_free(a);
    a->last_free = i;
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
    merge_last_free(a);
    uint32_t pos = shim_region_upper(a, addr);
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
    uint32_t pos = shim_region_upper(a, addr);
    return pos > 0 &&
           addr - a->regions[a->sorted[pos - 1]].base < a->regions[a->sorted[pos - 1]].size;
}

bool shim_arena_live_block_at(shim_arena *a, uintptr_t addr, uintptr_t *start)
{
    merge_last_free(a);
    uint32_t pos = shim_region_upper(a, addr);
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
    /* Counted by the reserved bytes, not by summing release_cached: the
     * merges below can empty a region and release an older cached one
     * (KEEP_EMPTY_REGIONS) before the loop runs, and those bytes were
     * released by this trim too (with keep > 0 they went uncounted). */
    uint64_t before = a->c.reserved_bytes;
    merge_last_free(a);
    quick_flush(a);
    while (a->empty_head != NIL && a->c.empty_bytes > keep && may_release(a))
        release_cached(a, a->empty_head);
    return (size_t)(before - a->c.reserved_bytes);
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

void shim_arena_get_counters(shim_arena *a, shim_arena_counters *c)
{
    merge_last_free(a);
    *c = a->c;
}

size_t shim_arena_limit(const shim_arena *a)
{
    return a->limit;
}