/* The region allocator against a fake backend: the backend keeps host-side
 * bookkeeping of the ranges it reserved at fake addresses (never touched),
 * and the tests compare the arena with a reference model: a sorted array of
 * live ranges. SEED=n in the environment replays a randomized test. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "arena_inspect.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

/* ---- fake backend -------------------------------------------------- */

typedef struct range {
    uintptr_t base;
    size_t size;
} range;

typedef struct fake {
    uintptr_t next;          /* bump pointer of fake address space */
    size_t total;            /* what mem_info reports as total */
    size_t max_reserve;      /* refuse single reservations above this (0 = none) */
    bool refuse_all;
    bool info_fails;
    int hard_error;          /* fail every reservation with this non-OOM error */
    size_t held;             /* bytes reserved now */
    range ranges[4096];
    size_t nranges;
    size_t reserves, releases, refusals;
} fake;

static int fake_reserve(void *ctx, size_t size, uintptr_t *addr)
{
    fake *f = ctx;
    if (f->hard_error) {
        f->refusals++;
        return -f->hard_error;
    }
    if (f->refuse_all || (f->max_reserve && size > f->max_reserve) ||
        f->held + size > f->total || f->nranges == 4096) {
        f->refusals++;
        return 1;
    }
    /* A gap between ranges, so that neighbouring regions never touch and
     * an off-by-one in the region lookup shows. */
    *addr = f->next;
    f->next += (size + 64 * KIB + 0xffff) & ~(uintptr_t)0xffff;
    f->ranges[f->nranges++] = (range){ *addr, size };
    f->held += size;
    f->reserves++;
    return 0;
}

static void fake_release(void *ctx, uintptr_t addr, size_t size)
{
    fake *f = ctx;
    for (size_t i = 0; i < f->nranges; i++) {
        if (f->ranges[i].base == addr) {
            cr_assert_eq(f->ranges[i].size, size, "release with a size other than reserved");
            f->ranges[i] = f->ranges[--f->nranges];
            f->held -= size;
            f->releases++;
            return;
        }
    }
    cr_assert_fail("release of a range never reserved: %#" PRIxPTR, addr);
}

static int fake_mem_info(void *ctx, size_t *fr, size_t *total)
{
    fake *f = ctx;
    if (f->info_fails)
        return 1;
    *total = f->total;
    *fr = f->total - f->held;
    return 0;
}

static const range *fake_find(const fake *f, uintptr_t addr)
{
    for (size_t i = 0; i < f->nranges; i++)
        if (addr >= f->ranges[i].base && addr - f->ranges[i].base < f->ranges[i].size)
            return &f->ranges[i];
    return NULL;
}

static fake *fake_new(size_t total)
{
    fake *f = calloc(1, sizeof *f);
    f->next = (uintptr_t)0x7f0000000000;
    f->total = total;
    return f;
}

static shim_region_backend backend_of(fake *f, size_t alignment)
{
    return (shim_region_backend){ .ctx = f, .reserve = fake_reserve, .release = fake_release,
                                  .mem_info = fake_mem_info, .alignment = alignment };
}

/* ---- helpers ------------------------------------------------------- */

typedef struct blk {
    uintptr_t addr;
    size_t size, block_bytes;
    uint32_t node;
} blk;

static blk must_alloc(shim_arena *a, size_t size)
{
    blk b = { .size = size };
    int rc = shim_arena_alloc(a, size, &b.addr, &b.node, &b.block_bytes);
    cr_assert_eq(rc, 0, "alloc of %zu bytes failed", size);
    return b;
}

static shim_arena_counters counters(shim_arena *a)
{
    shim_arena_counters c;
    shim_arena_get_counters(a, &c);
    return c;
}

static uint64_t seed_from_env(uint64_t dflt)
{
    const char *s = getenv("SEED");
    return s && *s ? strtoull(s, NULL, 0) : dflt;
}

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Log-uniform-ish sizes from 1 byte to `max`, not aligned. */
static size_t rand_size(uint64_t *s, size_t max)
{
    unsigned bits = 63u - (unsigned)__builtin_clzll(max);
    unsigned e = (unsigned)(rng_next(s) % (bits + 1));
    size_t lo = (size_t)1 << e;
    size_t v = lo + rng_next(s) % lo;
    return v > max ? max : v;
}

/* ---- reference model ----------------------------------------------- */

typedef struct model {
    blk *v;                  /* sorted by addr */
    size_t n, cap;
    uint64_t seed;
} model;

static size_t model_pos(const model *m, uintptr_t addr)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->v[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void model_add(model *m, blk b)
{
    if (m->n == m->cap) {
        m->cap = m->cap ? m->cap * 2 : 256;
        m->v = realloc(m->v, m->cap * sizeof *m->v);
    }
    size_t p = model_pos(m, b.addr);
    if (p < m->n)
        cr_assert(b.addr + b.block_bytes <= m->v[p].addr,
                  "seed=%" PRIu64 ": block %#" PRIxPTR "+%zu overlaps the next live block %#" PRIxPTR,
                  m->seed, b.addr, b.block_bytes, m->v[p].addr);
    if (p > 0)
        cr_assert(m->v[p - 1].addr + m->v[p - 1].block_bytes <= b.addr,
                  "seed=%" PRIu64 ": block %#" PRIxPTR " overlaps the previous live block %#" PRIxPTR
                  "+%zu", m->seed, b.addr, m->v[p - 1].addr, m->v[p - 1].block_bytes);
    memmove(&m->v[p + 1], &m->v[p], (m->n - p) * sizeof *m->v);
    m->v[p] = b;
    m->n++;
}

static blk model_take(model *m, size_t p)
{
    blk b = m->v[p];
    memmove(&m->v[p], &m->v[p + 1], (m->n - p - 1) * sizeof *m->v);
    m->n--;
    return b;
}

/* Everything the model can say about the arena's state. */
static void model_check(const model *m, shim_arena *a, const fake *f, size_t limit)
{
    const char *broken = shim_arena_check(a);
    cr_assert_null(broken, "seed=%" PRIu64 ": %s", m->seed, broken);
    shim_arena_counters c = counters(a);
    uint64_t used = 0;
    for (size_t i = 0; i < m->n; i++) {
        const blk *b = &m->v[i];
        used += b->block_bytes;
        uintptr_t rb = 0;
        size_t rs = 0;
        cr_assert_eq(shim_arena_classify(a, b->addr, &rb, &rs), SHIM_ADDR_LIVE_START,
                     "seed=%" PRIu64 ": live block %#" PRIxPTR " not classified live", m->seed, b->addr);
        /* The blocks tile their region: whatever follows a live block in
         * the region starts a block. */
        if (b->addr + b->block_bytes < rb + rs) {
            enum shim_block_kind k = shim_arena_classify(a, b->addr + b->block_bytes, NULL, NULL);
            cr_assert(k == SHIM_ADDR_LIVE_START || k == SHIM_ADDR_FREE_START,
                      "seed=%" PRIu64 ": the end of block %#" PRIxPTR " is not a block start (%d)",
                      m->seed, b->addr, (int)k);
        }
    }
    cr_assert_eq(c.used_bytes, used, "seed=%" PRIu64 ": used %" PRIu64 " != model %" PRIu64,
                 m->seed, c.used_bytes, used);
    cr_assert_eq(c.reserved_bytes, f->held, "seed=%" PRIu64 ": reserved %" PRIu64 " != backend %zu",
                 m->seed, c.reserved_bytes, f->held);
    cr_assert_eq(c.regions, f->nranges, "seed=%" PRIu64, m->seed);
    cr_assert_geq(c.reserved_bytes, c.used_bytes + c.empty_bytes, "seed=%" PRIu64, m->seed);
    cr_assert_geq(c.peak_reserved_bytes, c.reserved_bytes, "seed=%" PRIu64, m->seed);
    cr_assert_geq(c.peak_used_bytes, c.used_bytes, "seed=%" PRIu64, m->seed);
    cr_assert_eq(c.regions_reserved - c.regions_released, c.regions, "seed=%" PRIu64, m->seed);
    if (limit)
        cr_assert_leq(c.reserved_bytes, limit, "seed=%" PRIu64 ": over the limit", m->seed);
}

/* One randomized run: mixed allocs and frees, checking each new block
 * against the model and the whole state now and then; at the end frees
 * everything and checks that every byte came back (only possible when
 * both neighbours merge and empty regions are detected). */
static void random_run_from(uint64_t seed, size_t alignment, size_t limit, size_t region_size,
                            size_t max_size, unsigned ops, uint32_t quick_from)
{
    fake *f = fake_new(64 * GIB);
    shim_region_backend be = backend_of(f, alignment);
    shim_arena *a = shim_arena_create(&be, limit, region_size);
    cr_assert_not_null(a);
    shim_arena_set_quick_from(a, quick_from);
    model m = { .seed = seed };
    uint64_t s = seed;
    for (unsigned op = 0; op < ops; op++) {
        bool do_alloc = m.n == 0 || rng_next(&s) % 100 < 55;
        if (do_alloc) {
            size_t size = rand_size(&s, max_size);
            blk b = { .size = size };
            int rc = shim_arena_alloc(a, size, &b.addr, &b.node, &b.block_bytes);
            if (rc != 0) {
                cr_assert(limit != 0, "seed=%" PRIu64 ": alloc of %zu failed without a limit",
                          seed, size);
                continue;
            }
            cr_assert_eq(b.addr % alignment, 0, "seed=%" PRIu64 ": misaligned %#" PRIxPTR, seed, b.addr);
            cr_assert_geq(b.block_bytes, size, "seed=%" PRIu64, seed);
            cr_assert_eq(b.block_bytes % alignment, 0, "seed=%" PRIu64, seed);
            const range *r = fake_find(f, b.addr);
            cr_assert_not_null(r, "seed=%" PRIu64 ": block outside every region", seed);
            cr_assert_leq(b.addr + b.block_bytes, r->base + r->size,
                          "seed=%" PRIu64 ": block crosses its region's end", seed);
            /* The node is the block's record: address, requested size and
             * the owner's tags read back from it. */
            shim_arena_set_tags(a, b.node, (uint32_t)size, (uint32_t)b.addr);
            model_add(&m, b);
        } else {
            blk b = model_take(&m, rng_next(&s) % m.n);
            cr_assert_eq(shim_arena_block_addr(a, b.node), b.addr, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_block_requested(a, b.node), b.size, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_tag(a, b.node, 0), (uint32_t)b.size, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_tag(a, b.node, 1), (uint32_t)b.addr, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_free_node(a, b.node), b.block_bytes, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_block_addr(a, b.node), 0, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_block_requested(a, b.node), 0, "seed=%" PRIu64, seed);
            cr_assert_eq(shim_arena_classify(a, b.addr, NULL, NULL) != SHIM_ADDR_LIVE_START, 1,
                         "seed=%" PRIu64 ": freed block still live", seed);
        }
        if (op % 997 == 0)
            model_check(&m, a, f, limit);
    }
    model_check(&m, a, f, limit);
    while (m.n)
        shim_arena_free_node(a, model_take(&m, rng_next(&s) % m.n).node);
    shim_arena_counters c = counters(a);
    cr_assert_eq(c.used_bytes, 0, "seed=%" PRIu64, seed);
    cr_assert_eq(c.reserved_bytes, c.empty_bytes,
                 "seed=%" PRIu64 ": with nothing live, %" PRIu64 " reserved but %" PRIu64
                 " in empty regions", seed, c.reserved_bytes, c.empty_bytes);
    shim_arena_trim(a, 0);
    cr_assert_eq(f->held, 0, "seed=%" PRIu64 ": %zu bytes still held after trim", seed, f->held);
    shim_arena_destroy(a);
    free(m.v);
    free(f);
}

/* Quick lists from the first block on. */
static void random_run(uint64_t seed, size_t alignment, size_t limit, size_t region_size,
                       size_t max_size, unsigned ops)
{
    random_run_from(seed, alignment, limit, region_size, max_size, ops, 0);
}

Test(arena, random_sequences_keep_blocks_disjoint_aligned_and_accounted)
{
    uint64_t seed = seed_from_env(0x5eed);
    fprintf(stderr, "arena random: SEED=%" PRIu64 "\n", seed);
    for (unsigned k = 0; k < 4; k++)
        random_run(seed + k, 256, 0, 0, 8 * MIB, 20000);
}

Test(arena, random_sequences_with_small_fixed_regions_and_dedicated_blocks)
{
    uint64_t seed = seed_from_env(0x5eed) + 100;
    fprintf(stderr, "arena random small regions: SEED=%" PRIu64 "\n", seed);
    random_run(seed, 256, 0, 1 * MIB, 2 * MIB, 20000);
}

Test(arena, random_sequences_under_a_limit_never_exceed_it)
{
    uint64_t seed = seed_from_env(0x5eed) + 200;
    fprintf(stderr, "arena random limit: SEED=%" PRIu64 "\n", seed);
    random_run(seed, 256, 96 * MIB, 0, 4 * MIB, 20000);
}

/* The live blocks go past 1,000 and back: carves before the lists come
 * into use leave neighbour bits that say free where it is not. */
Test(arena, random_sequences_across_the_quick_lists_threshold)
{
    uint64_t seed = seed_from_env(24701);
    fprintf(stderr, "arena random quick threshold: SEED=%" PRIu64 "\n", seed);
    random_run_from(seed, 256, 0, 0, 1 * MIB, 30000, 1000);
}

Test(arena, random_sequences_honour_a_larger_backend_alignment)
{
    uint64_t seed = seed_from_env(0x5eed) + 300;
    fprintf(stderr, "arena random 64K alignment: SEED=%" PRIu64 "\n", seed);
    random_run(seed, 64 * KIB, 0, 0, 4 * MIB, 10000);
}

/* ---- directed tests ------------------------------------------------ */

typedef struct setup {
    fake *f;
    shim_arena *a;
} setup;

static setup make(size_t total, size_t limit, size_t region)
{
    setup s = { .f = fake_new(total) };
    shim_region_backend be = backend_of(s.f, 256);
    s.a = shim_arena_create(&be, limit, region);
    cr_assert_not_null(s.a);
    shim_arena_set_quick_from(s.a, 0); /* quick lists at any size */
    return s;
}

static void unmake(setup s)
{
    shim_arena_destroy(s.a);
    cr_assert_eq(s.f->held, 0, "destroy must release every region");
    free(s.f);
}

Test(arena, freeing_a_block_between_two_free_blocks_merges_all_three)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk x = must_alloc(s.a, 256 * KIB);
    blk y = must_alloc(s.a, 256 * KIB);
    blk z = must_alloc(s.a, 256 * KIB);
    blk w = must_alloc(s.a, 256 * KIB);   /* fills the region */
    cr_assert_eq(counters(s.a).regions, 1);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, z.node);
    /* Neither free neighbour alone holds 768 KiB. */
    shim_arena_free_node(s.a, y.node);
    blk big = must_alloc(s.a, 768 * KIB);
    cr_assert_eq(big.addr, x.addr, "the three blocks merged into one at the first's address");
    cr_assert_eq(counters(s.a).regions_reserved, 1, "served without a new region");
    shim_arena_free_node(s.a, big.node);
    shim_arena_free_node(s.a, w.node);
    cr_assert_eq(counters(s.a).empty_regions, 1, "the region is detected empty");
    cr_assert_eq(counters(s.a).empty_bytes, 1 * MIB);
    unmake(s);
}

/* Quick lists: a freed block of a size class's exact size waits, unmerged,
 * for the next request of that class, the last freed first. */
Test(arena, a_freed_block_of_a_common_size_comes_back_as_is_to_the_next_request_of_its_size)
{
    setup s = make(1 * GIB, 0, 64 * MIB);
    blk b[1000];
    for (int i = 0; i < 1000; i++)
        b[i] = must_alloc(s.a, 4096);
    cr_assert_eq(b[501].addr, b[500].addr + 4096, "neighbours in the region");
    cr_assert_eq(shim_arena_free_node(s.a, b[500].node), 4096);
    cr_assert_eq(shim_arena_free_node(s.a, b[501].node), 4096);
    cr_assert_eq(shim_arena_classify(s.a, b[500].addr, NULL, NULL), SHIM_ADDR_FREE_START);
    /* Merged, the two would be one block at b[500]: a block of their
     * class comes from the lowest fitting bin, at its start. */
    cr_assert_eq(shim_arena_classify(s.a, b[501].addr, NULL, NULL), SHIM_ADDR_FREE_START,
                 "the later block was merged into the earlier one");
    cr_assert_eq(shim_arena_free_node(s.a, b[501].node), 0, "a second free of it is refused");
    cr_assert_eq(counters(s.a).used_bytes, 998 * 4096, "a cached block is not in use");
    blk x = must_alloc(s.a, 4000);
    cr_assert_eq(x.addr, b[501].addr, "the last block freed comes back first");
    cr_assert_eq(x.block_bytes, 4096);
    blk y = must_alloc(s.a, 4096);
    cr_assert_eq(y.addr, b[500].addr);
    cr_assert_eq(shim_arena_classify(s.a, y.addr, NULL, NULL), SHIM_ADDR_LIVE_START);
    cr_assert_eq(shim_arena_block_requested(s.a, x.node), 4000, "the new request's size");
    cr_assert_eq(counters(s.a).used_bytes, 1000 * 4096);
    cr_assert_eq(counters(s.a).regions_reserved, 1);
    b[500] = y;
    b[501] = x;
    for (int i = 0; i < 1000; i++)
        shim_arena_free_node(s.a, b[i].node);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.used_bytes, 0);
    cr_assert_eq(c.empty_bytes, c.reserved_bytes, "nothing live: every region shows empty");
    unmake(s);
}

Test(arena, blocks_waiting_on_quick_lists_merge_before_a_region_is_reserved)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk b[256];
    for (int i = 0; i < 256; i++)
        b[i] = must_alloc(s.a, 4096);                 /* the whole region */
    cr_assert_eq(counters(s.a).regions_reserved, 1);
    for (int i = 64; i < 96; i++)
        shim_arena_free_node(s.a, b[i].node);
    blk big = must_alloc(s.a, 128 * KIB);
    cr_assert_eq(counters(s.a).regions_reserved, 1, "the freed run was enough");
    cr_assert_eq(big.addr, b[64].addr);
    shim_arena_free_node(s.a, big.node);
    for (int i = 0; i < 256; i++)
        if (i < 64 || i >= 96)
            shim_arena_free_node(s.a, b[i].node);
    cr_assert_eq(counters(s.a).empty_bytes, 1 * MIB);
    unmake(s);
}

Test(arena, quick_lists_start_at_65536_live_blocks)
{
    setup s = make(1 * GIB, 0, 64 * MIB);
    shim_arena_set_quick_from(s.a, 65536);
    /* Few blocks, many bytes: the lists' byte bound would allow them. */
    blk big = must_alloc(s.a, 32 * MIB);
    blk x = must_alloc(s.a, 4096), y = must_alloc(s.a, 4096), g = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, y.node);
    cr_assert_eq(shim_arena_classify(s.a, y.addr, NULL, NULL), SHIM_ADDR_INTERIOR,
                 "with 3 live blocks, x waited on a list instead of merging with y");
    enum { N = 65536 + 4 };
    blk *b = malloc(N * sizeof *b);
    for (int i = 0; i < N; i++)
        b[i] = must_alloc(s.a, 256);
    /* Carved after the lists came into use, so their neighbour bits are
     * exact (those carved before still say their next block is free). */
    shim_arena_free_node(s.a, b[N - 3].node);
    shim_arena_free_node(s.a, b[N - 2].node);
    cr_assert_eq(shim_arena_classify(s.a, b[N - 2].addr, NULL, NULL), SHIM_ADDR_FREE_START,
                 "with 65,540 live blocks, two blocks merged instead of waiting");
    blk z = must_alloc(s.a, 256);
    cr_assert_eq(z.addr, b[N - 2].addr, "the last block freed comes back first");
    b[N - 2] = z;
    for (int i = 0; i < N; i++)
        if (i != N - 3)
            shim_arena_free_node(s.a, b[i].node);
    shim_arena_free_node(s.a, big.node);
    shim_arena_free_node(s.a, g.node);
    cr_assert_eq(counters(s.a).empty_bytes, counters(s.a).reserved_bytes);
    free(b);
    unmake(s);
}

/* Blocks above 1 MiB never wait on a quick list: freed, they are free. */
Test(arena, a_block_freed_next_to_a_free_block_merges_with_it_at_once)
{
    setup s = make(1 * GIB, 0, 64 * MIB);
    blk x = must_alloc(s.a, 4096);
    blk big = must_alloc(s.a, 2 * MIB);
    blk z = must_alloc(s.a, 4096);
    blk w = must_alloc(s.a, 4096);
    cr_assert_eq(z.addr, big.addr + big.block_bytes);
    shim_arena_free_node(s.a, big.node);
    shim_arena_free_node(s.a, z.node);
    cr_assert_eq(shim_arena_classify(s.a, z.addr, NULL, NULL), SHIM_ADDR_INTERIOR,
                 "z waits on a list next to a free block instead of merging");
    blk again = must_alloc(s.a, 2 * MIB);
    cr_assert_eq(again.addr, big.addr, "the merged block is in the 2 MiB bin");
    shim_arena_free_node(s.a, again.node);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, w.node);
    unmake(s);
}

Test(arena, freeing_the_neighbour_of_a_waiting_block_merges_the_waiting_block_too)
{
    setup s = make(1 * GIB, 0, 64 * MIB);
    blk x = must_alloc(s.a, 4096);
    blk big = must_alloc(s.a, 2 * MIB);
    blk c = must_alloc(s.a, 4096);
    blk d = must_alloc(s.a, 4096);
    blk w = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, c.node);
    shim_arena_free_node(s.a, d.node);
    cr_assert_eq(shim_arena_classify(s.a, d.addr, NULL, NULL), SHIM_ADDR_FREE_START,
                 "d does not wait, whole, next to c");
    shim_arena_free_node(s.a, big.node);
    cr_assert_eq(shim_arena_classify(s.a, c.addr, NULL, NULL), SHIM_ADDR_INTERIOR,
                 "c still waits next to a free block");
    cr_assert_eq(shim_arena_classify(s.a, d.addr, NULL, NULL), SHIM_ADDR_INTERIOR,
                 "the run of waiting blocks did not merge whole");
    blk again = must_alloc(s.a, 2 * MIB);
    cr_assert_eq(again.addr, big.addr, "the merged block is in the 2 MiB bin");
    shim_arena_free_node(s.a, again.node);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, w.node);
    unmake(s);
}

Test(arena, a_waiting_block_of_a_larger_class_is_taken_before_a_larger_free_block)
{
    setup s = make(1 * GIB, 0, 64 * MIB);
    blk keep = must_alloc(s.a, 4 * MIB);     /* enough in use for the lists */
    blk p = must_alloc(s.a, 8192);
    blk q = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, p.node);        /* waits; the region's tail is free */
    blk x = must_alloc(s.a, 4096);
    cr_assert_eq(x.addr, p.addr, "best fit takes the 8 KiB block, not the region's tail");
    blk y = must_alloc(s.a, 4096);
    cr_assert_eq(y.addr, p.addr + 4096, "the rest of it is free and comes next");
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, y.node);
    shim_arena_free_node(s.a, q.node);
    shim_arena_free_node(s.a, keep.node);
    cr_assert_eq(counters(s.a).empty_bytes, 64 * MIB);
    unmake(s);
}

/* Regions of 1 MiB holding four 256 KiB blocks each; frees the blocks
 * of the last one, in an order where none is next to a free block. */
static setup regions_of_four(blk *b, int regions)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    for (int i = 0; i < 4 * regions; i++)
        b[i] = must_alloc(s.a, 256 * KIB);
    cr_assert_eq(counters(s.a).regions, (uint64_t)regions);
    int order[4] = { 0, 2, 1, 3 };
    for (int k = 0; k < 4; k++)
        shim_arena_free_node(s.a, b[4 * (regions - 1) + order[k]].node);
    return s;
}

Test(arena, trim_merges_what_waits_on_quick_lists_and_releases_the_regions_it_empties)
{
    blk b[80];
    setup s = regions_of_four(b, 20);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.used_bytes, 19 * MIB);
    cr_assert_eq(c.empty_regions, 0, "the freed blocks wait, whole, on the lists");
    cr_assert_eq(shim_arena_trim(s.a, 0), 1 * MIB);
    c = counters(s.a);
    cr_assert_eq(c.regions, 19);
    cr_assert_eq(c.reserved_bytes, 19 * MIB);
    for (int i = 0; i < 76; i++)
        shim_arena_free_node(s.a, b[i].node);
    cr_assert_eq(counters(s.a).empty_bytes, counters(s.a).reserved_bytes);
    unmake(s);
}

Test(arena, quick_lists_hold_at_most_a_sixteenth_of_the_bytes_in_use)
{
    blk b[16];
    setup s = regions_of_four(b, 4);
    /* 3 MiB in use: 192 KiB may wait, less than a block. */
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.used_bytes, 3 * MIB);
    cr_assert_eq(c.empty_regions, 1, "the freed blocks merged: their region is empty");
    for (int i = 0; i < 12; i++)
        shim_arena_free_node(s.a, b[i].node);
    unmake(s);
}

Test(arena, a_fully_free_region_serves_a_region_sized_request)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk b[8];
    for (int i = 0; i < 8; i++)
        b[i] = must_alloc(s.a, 128 * KIB);
    int order[8] = { 3, 0, 7, 5, 1, 6, 2, 4 };
    for (int i = 0; i < 8; i++)
        shim_arena_free_node(s.a, b[order[i]].node);
    blk all = must_alloc(s.a, 512 * KIB);
    cr_assert_eq(counters(s.a).regions_reserved, 1);
    shim_arena_free_node(s.a, all.node);
    unmake(s);
}

Test(arena, request_above_half_a_region_gets_a_dedicated_region_of_its_size_cached_when_freed)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk small = must_alloc(s.a, 512 * KIB);   /* leaves less than the big one needs */
    blk big = must_alloc(s.a, 600 * KIB + 1);
    size_t exact = big.block_bytes;
    cr_assert_geq(exact, 600 * KIB + 1);
    cr_assert_leq(exact, 600 * KIB + 600 * KIB / 64 + 256, "a dedicated region fits its request");
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.regions, 2);
    cr_assert_eq(c.reserved_bytes, 1 * MIB + exact);
    const range *r = fake_find(s.f, big.addr);
    cr_assert_not_null(r);
    cr_assert_eq(r->base, big.addr);
    cr_assert_eq(r->size, exact, "the block is the whole region");
    cr_assert_eq(shim_arena_free_node(s.a, big.node), exact);
    c = counters(s.a);
    cr_assert_eq(c.regions, 2, "the freed dedicated region stays cached");
    cr_assert_eq(c.empty_regions, 1);
    cr_assert_eq(c.empty_bytes, exact);
    /* Freeing and reallocating a large block in a loop costs no runtime call. */
    for (int k = 0; k < 5; k++) {
        blk again = must_alloc(s.a, 600 * KIB + 1);
        cr_assert_eq(again.addr, big.addr);
        shim_arena_free_node(s.a, again.node);
    }
    cr_assert_eq(s.f->reserves, 2);
    /* Another region becoming empty sends the older empty one back. */
    shim_arena_free_node(s.a, small.node);
    c = counters(s.a);
    cr_assert_eq(c.regions, 1);
    cr_assert_eq(c.regions_released, 1);
    cr_assert_eq(c.reserved_bytes, 1 * MIB);
    cr_assert_eq(shim_arena_classify(s.a, big.addr, NULL, NULL), SHIM_ADDR_OUTSIDE);
    unmake(s);
}

Test(arena, a_cached_dedicated_region_serves_its_own_size_only)
{
    /* A 14 MiB block freed, then a 4.5 MiB one: as without the shim, the
     * runtime places the smaller block (the cached region goes back first,
     * so it may go where the freed one was), instead of it being carved from
     * the cached region and pinning its other 9.5 MiB, which only this
     * arena could use. */
    setup s = make(1 * GIB, 0, 2 * MIB);
    blk big = must_alloc(s.a, 14 * MIB);
    shim_arena_free_node(s.a, big.node);
    cr_assert_eq(counters(s.a).empty_regions, 1, "cached");
    blk mid = must_alloc(s.a, 4 * MIB + 512 * KIB);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.empty_regions, 0, "the cached region went back");
    cr_assert_eq(c.regions, 1);
    cr_assert_eq(c.reserved_bytes, mid.block_bytes, "a region of the request's own");
    cr_assert_eq(s.f->releases, 1);
    /* The same size again still reuses its cached region. */
    blk big2 = must_alloc(s.a, 14 * MIB);
    shim_arena_free_node(s.a, big2.node);
    size_t reserves = s.f->reserves;
    blk big3 = must_alloc(s.a, 14 * MIB);
    cr_assert_eq(big3.addr, big2.addr);
    cr_assert_eq(s.f->reserves, reserves, "no runtime call");
    shim_arena_free_node(s.a, big3.node);
    shim_arena_free_node(s.a, mid.node);
    unmake(s);
}

Test(arena, keeps_one_empty_region_and_releases_the_rest)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk b[3];
    for (int i = 0; i < 3; i++)
        b[i] = must_alloc(s.a, 512 * KIB);   /* half a region: shared, two per region */
    blk c3 = must_alloc(s.a, 512 * KIB);
    cr_assert_eq(counters(s.a).regions, 2);
    shim_arena_free_node(s.a, b[0].node);
    shim_arena_free_node(s.a, b[1].node);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.empty_regions, 1, "one empty region stays cached");
    cr_assert_eq(c.regions, 2);
    shim_arena_free_node(s.a, b[2].node);
    shim_arena_free_node(s.a, c3.node);
    c = counters(s.a);
    cr_assert_eq(c.regions, 1, "a second empty region is released");
    cr_assert_eq(c.empty_regions, 1);
    cr_assert_eq(c.regions_released, 1);
    /* The cached region is reused without a new reservation. */
    blk again = must_alloc(s.a, 512 * KIB);
    cr_assert_eq(counters(s.a).regions_reserved, 2);
    cr_assert_eq(counters(s.a).empty_regions, 0, "a region in use is not empty");
    shim_arena_free_node(s.a, again.node);
    unmake(s);
}

Test(arena, trim_releases_cached_empty_regions_down_to_keep)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk b = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, b.node);
    cr_assert_eq(counters(s.a).empty_bytes, 1 * MIB);
    cr_assert_eq(shim_arena_trim(s.a, 1 * MIB), 0, "keep covers the cached region");
    cr_assert_eq(shim_arena_trim(s.a, 0), 1 * MIB);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.reserved_bytes, 0);
    cr_assert_eq(c.regions, 0);
    cr_assert_eq(c.empty_regions, 0);
    cr_assert_eq(c.empty_bytes, 0);
    cr_assert_eq(s.f->held, 0);
    cr_assert_eq(c.peak_reserved_bytes, 1 * MIB, "peaks survive a trim");
    /* Works again after everything was released. */
    b = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, b.node);
    unmake(s);
}

Test(arena, a_64M_limit_serves_close_to_64_MiB_of_1M_requests)
{
    setup s = make(16 * GIB, 64 * MIB, 0);
    unsigned ok = 0;
    blk b[128];
    while (ok < 128) {
        blk x = { 0 };
        if (shim_arena_alloc(s.a, 1 * MIB, &x.addr, &x.node, &x.block_bytes) != 0)
            break;
        b[ok++] = x;
    }
    cr_assert_geq(ok, 63, "only %u MiB served under a 64 MiB limit", ok);
    cr_assert_leq(ok, 64);
    shim_arena_counters c = counters(s.a);
    cr_assert_leq(c.reserved_bytes, 64 * MIB);
    cr_assert_eq(shim_arena_limit(s.a), 64 * MIB);
    for (unsigned i = 0; i < ok; i++)
        shim_arena_free_node(s.a, b[i].node);
    unmake(s);
}

Test(arena, a_request_above_the_limit_fails_without_reserving)
{
    setup s = make(16 * GIB, 64 * MIB, 0);
    blk x = { 0 };
    cr_assert_eq(shim_arena_alloc(s.a, 65 * MIB, &x.addr, &x.node, &x.block_bytes), -1);
    cr_assert_eq(s.f->reserves, 0);
    cr_assert_eq(counters(s.a).reserved_bytes, 0);
    unmake(s);
}

Test(arena, the_limit_frees_cached_empty_regions_to_make_room)
{
    setup s = make(16 * GIB, 4 * MIB, 2 * MIB);
    blk a1 = must_alloc(s.a, 1 * MIB);
    blk a2 = must_alloc(s.a, 1 * MIB + 512 * KIB);   /* dedicated region */
    shim_arena_free_node(s.a, a1.node);             /* first region empty, cached */
    shim_arena_free_node(s.a, a2.node);             /* cached instead; the first released */
    cr_assert_eq(counters(s.a).reserved_bytes, 1 * MIB + 512 * KIB);
    cr_assert_eq(counters(s.a).empty_regions, 1);
    /* 3 MiB needs a dedicated region; only the cached region's release
     * makes room for it under the limit. */
    blk big = must_alloc(s.a, 3 * MIB);
    cr_assert_eq(counters(s.a).reserved_bytes, 3 * MIB);
    shim_arena_free_node(s.a, big.node);
    unmake(s);
}

Test(arena, a_request_beyond_the_largest_block_fails_cleanly)
{
    setup s = make((size_t)1 << 62, 0, 0);
    blk x = { 0 };
    cr_assert_eq(shim_arena_alloc(s.a, (size_t)1 << 50, &x.addr, &x.node, &x.block_bytes), -1);
    cr_assert_eq(shim_arena_alloc(s.a, SIZE_MAX, &x.addr, &x.node, &x.block_bytes), -1);
    cr_assert_eq(s.f->reserves, 0);
    blk y = must_alloc(s.a, 1000);
    shim_arena_free_node(s.a, y.node);
    unmake(s);
}

Test(arena, backend_refusing_every_region_makes_alloc_fail_cleanly)
{
    setup s = make(16 * GIB, 0, 0);
    s.f->refuse_all = true;
    blk x = { 0 };
    cr_assert_eq(shim_arena_alloc(s.a, 4096, &x.addr, &x.node, &x.block_bytes), -1);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.reserved_bytes, 0);
    cr_assert_eq(c.regions, 0);
    cr_assert_eq(c.used_bytes, 0);
    s.f->refuse_all = false;
    blk y = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, y.node);
    unmake(s);
}

Test(arena, a_backend_error_other_than_out_of_memory_is_returned_without_retries)
{
    setup s = make(16 * GIB, 0, 0);
    blk y = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, y.node);            /* an empty region, cached */
    s.f->hard_error = 35;
    blk x = { 0 };
    size_t before = s.f->refusals;
    /* Larger than the cached region: a new region is needed. */
    cr_assert_eq(shim_arena_alloc(s.a, 512 * MIB, &x.addr, &x.node, &x.block_bytes), 35);
    cr_assert_eq(s.f->refusals, before + 1, "no smaller region tried, no retry");
    /* The cached region went back before the new one was asked for (where
     * the runtime would have placed the request without the shim). */
    cr_assert_eq(counters(s.a).empty_regions, 0);
    s.f->hard_error = 0;
    x = must_alloc(s.a, 512 * MIB);
    shim_arena_free_node(s.a, x.node);
    unmake(s);
}

Test(arena, backend_refusing_a_whole_region_still_serves_a_request_that_fits)
{
    setup s = make(16 * GIB, 0, 64 * MIB);
    s.f->max_reserve = 5 * MIB;
    s.f->info_fails = true;
    blk x = must_alloc(s.a, 3 * MIB);
    cr_assert_geq(s.f->refusals, 1);
    const range *r = fake_find(s.f, x.addr);
    cr_assert_not_null(r);
    cr_assert_leq(r->size, 5 * MIB);
    shim_arena_free_node(s.a, x.node);
    unmake(s);
}

Test(arena, a_refused_region_is_halved_until_the_runtime_takes_it)
{
    /* Regions of 64 MiB; the runtime takes at most 5 MiB at a time and
     * does not say how much it has (mem_info fails): 64, 32, 16 and 8 MiB
     * are refused and 4 MiB is taken, a shared region (not one cut to the
     * request) that serves the next request too. */
    setup s = make(16 * GIB, 0, 64 * MIB);
    s.f->max_reserve = 5 * MIB;
    s.f->info_fails = true;
    blk x = must_alloc(s.a, 1 * MIB);
    cr_assert_eq(s.f->refusals, 4, "refused %zu times, not 64 -> 32 -> 16 -> 8 -> 4 MiB",
                 s.f->refusals);
    const range *r = fake_find(s.f, x.addr);
    cr_assert_not_null(r);
    cr_assert_eq(r->size, 4 * MIB, "the region taken is %zu bytes, not the largest halving "
                 "the runtime takes", r->size);
    blk y = must_alloc(s.a, 2 * MIB);
    cr_assert_eq(s.f->reserves, 1, "a second region for what the halved one holds");
    cr_assert_eq(fake_find(s.f, y.addr), r);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, y.node);
    unmake(s);
}

Test(arena, backend_with_room_for_only_the_exact_request_still_serves_it)
{
    setup s = make(16 * GIB, 0, 1 * MIB);
    s.f->info_fails = true;
    size_t exact = 600 * KIB + 256;
    s.f->max_reserve = exact;                  /* less than the size class */
    blk x = must_alloc(s.a, 600 * KIB + 1);
    cr_assert_eq(x.block_bytes, exact);
    blk y = must_alloc(s.a, 100 * KIB);        /* a shared region: 1 MiB refused, halved */
    cr_assert_leq(fake_find(s.f, y.addr)->size, exact);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, y.node);
    unmake(s);
}

Test(arena, regions_shrink_to_the_runtimes_free_memory)
{
    setup s = make(3 * MIB, 0, 64 * MIB);
    blk x = must_alloc(s.a, 1 * MIB);
    blk y = must_alloc(s.a, 1 * MIB);
    cr_assert_eq(s.f->refusals, 0, "the region was cut to what mem_info reports free");
    cr_assert_leq(counters(s.a).reserved_bytes, 3 * MIB);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, y.node);
    unmake(s);
}

Test(arena, counters_track_usage_and_peaks)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk x = must_alloc(s.a, 100 * KIB);
    blk y = must_alloc(s.a, 200 * KIB);
    shim_arena_counters c = counters(s.a);
    cr_assert_eq(c.used_bytes, x.block_bytes + y.block_bytes);
    cr_assert_eq(c.reserved_bytes, 1 * MIB);
    cr_assert_eq(c.regions, 1);
    cr_assert_eq(c.regions_reserved, 1);
    shim_arena_free_node(s.a, y.node);
    c = counters(s.a);
    cr_assert_eq(c.used_bytes, x.block_bytes);
    cr_assert_eq(c.peak_used_bytes, x.block_bytes + y.block_bytes);
    blk d = must_alloc(s.a, 950 * KIB);           /* more than is free: dedicated */
    c = counters(s.a);
    cr_assert_eq(c.peak_reserved_bytes, 1 * MIB + d.block_bytes);
    shim_arena_free_node(s.a, d.node);
    shim_arena_free_node(s.a, x.node);
    c = counters(s.a);
    cr_assert_eq(c.used_bytes, 0);
    cr_assert_eq(c.peak_reserved_bytes, 1 * MIB + d.block_bytes);
    cr_assert_eq(c.peak_used_bytes, x.block_bytes + d.block_bytes);
    cr_assert_eq(c.regions_released, 1);
    unmake(s);
}

Test(arena, requests_are_rounded_up_to_their_size_class_only)
{
    setup s = make(16 * GIB, 0, 0);
    uint64_t seed = 7;
    for (int i = 0; i < 2000; i++) {
        size_t size = rand_size(&seed, 8 * MIB);
        blk b = must_alloc(s.a, size);
        size_t aligned = (size + 255) & ~(size_t)255;
        cr_assert_geq(b.block_bytes, aligned);
        /* Within one sub-bin (1/64, SL_COUNT) above the aligned size. */
        cr_assert_leq((double)b.block_bytes, (double)aligned * (1.0 + 1.0 / 64), "size %zu took %zu",
                      size, b.block_bytes);
        shim_arena_free_node(s.a, b.node);
    }
    unmake(s);
}

Test(arena, classify_tells_live_free_interior_and_outside_addresses)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk x = must_alloc(s.a, 4096);
    blk y = must_alloc(s.a, 4096);
    blk z = must_alloc(s.a, 4096);
    shim_arena_free_node(s.a, y.node);
    uintptr_t rb = 0;
    size_t rs = 0;
    cr_assert_eq(shim_arena_classify(s.a, x.addr, &rb, &rs), SHIM_ADDR_LIVE_START);
    cr_assert_eq(rs, 1 * MIB);
    cr_assert(x.addr >= rb && x.addr < rb + rs);
    cr_assert_eq(shim_arena_classify(s.a, y.addr, NULL, NULL), SHIM_ADDR_FREE_START,
                 "a freed block's start reads as a double free");
    cr_assert_eq(shim_arena_classify(s.a, x.addr + 256, NULL, NULL), SHIM_ADDR_INTERIOR);
    cr_assert_eq(shim_arena_classify(s.a, z.addr + 4095, NULL, NULL), SHIM_ADDR_INTERIOR);
    cr_assert_eq(shim_arena_classify(s.a, z.addr, NULL, NULL), SHIM_ADDR_LIVE_START);
    /* The trailing free block is free at its start and interior beyond. */
    uintptr_t tail = z.addr + z.block_bytes;
    cr_assert_eq(shim_arena_classify(s.a, tail, NULL, NULL), SHIM_ADDR_FREE_START);
    cr_assert_eq(shim_arena_classify(s.a, tail + 512, NULL, NULL), SHIM_ADDR_INTERIOR);
    cr_assert_eq(shim_arena_classify(s.a, rb - 1, NULL, NULL), SHIM_ADDR_OUTSIDE);
    cr_assert_eq(shim_arena_classify(s.a, rb + rs, NULL, NULL), SHIM_ADDR_OUTSIDE);
    cr_assert_eq(shim_arena_classify(s.a, 0x1000, NULL, NULL), SHIM_ADDR_OUTSIDE);
    cr_assert_eq(shim_arena_classify(s.a, UINTPTR_MAX, NULL, NULL), SHIM_ADDR_OUTSIDE);
    shim_arena_free_node(s.a, x.node);
    shim_arena_free_node(s.a, z.node);
    unmake(s);
}

Test(arena, classify_finds_the_right_region_among_many)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk b[40];
    for (int i = 0; i < 40; i++)
        b[i] = must_alloc(s.a, 700 * KIB);          /* one region each (dedicated) */
    for (int i = 0; i < 40; i++) {
        uintptr_t rb = 0;
        size_t rs = 0;
        cr_assert_eq(shim_arena_classify(s.a, b[i].addr, &rb, &rs), SHIM_ADDR_LIVE_START);
        cr_assert_eq(rb, b[i].addr);
        cr_assert_eq(shim_arena_classify(s.a, b[i].addr + b[i].block_bytes, NULL, NULL), SHIM_ADDR_OUTSIDE,
                     "the gap after a region is outside");
    }
    for (int i = 0; i < 40; i += 2)
        shim_arena_free_node(s.a, b[i].node);
    /* The last one freed stays cached (free), the others went back. */
    for (int i = 0; i < 40; i++)
        cr_assert_eq(shim_arena_classify(s.a, b[i].addr, NULL, NULL),
                     i % 2 ? SHIM_ADDR_LIVE_START : i == 38 ? SHIM_ADDR_FREE_START : SHIM_ADDR_OUTSIDE);
    for (int i = 1; i < 40; i += 2)
        shim_arena_free_node(s.a, b[i].node);
    unmake(s);
}

Test(arena, freeing_a_handle_twice_or_a_bogus_handle_changes_nothing)
{
    setup s = make(1 * GIB, 0, 1 * MIB);
    blk x = must_alloc(s.a, 4096);
    blk y = must_alloc(s.a, 4096);
    cr_assert_eq(shim_arena_free_node(s.a, x.node), x.block_bytes);
    shim_arena_counters before = counters(s.a);
    cr_assert_eq(shim_arena_free_node(s.a, x.node), 0);
    cr_assert_eq(shim_arena_free_node(s.a, 123456), 0);
    cr_assert_eq(shim_arena_free_node(s.a, UINT32_MAX), 0);
    shim_arena_counters after = counters(s.a);
    cr_assert_eq(memcmp(&before, &after, sizeof before), 0);
    shim_arena_free_node(s.a, y.node);
    unmake(s);
}

Test(arena, adaptive_regions_are_small_for_a_small_runtime_and_grow_with_use)
{
    setup s = make(256 * MIB, 0, 0);
    blk x = must_alloc(s.a, 4096);
    cr_assert_leq(counters(s.a).reserved_bytes, 8 * MIB,
                  "a 256 MiB runtime does not get a huge first region");
    shim_arena_free_node(s.a, x.node);
    unmake(s);

    s = make(64 * GIB, 0, 0);
    blk b[400];
    for (int i = 0; i < 400; i++)
        b[i] = must_alloc(s.a, 4 * MIB);
    shim_arena_counters c = counters(s.a);
    cr_assert_leq((double)c.reserved_bytes, 400.0 * 4 * MIB * 1.15,
                  "the slack stays a small fraction (%" PRIu64 " reserved)", c.reserved_bytes);
    cr_assert_lt(c.regions, 60, "regions grow with use (%" PRIu64 " regions)", c.regions);
    for (int i = 0; i < 400; i++)
        shim_arena_free_node(s.a, b[i].node);
    unmake(s);
}

/* What trim returns is what it released, keep > 0 included: the merges it
 * starts with can empty a region and release the older cached one
 * (KEEP_EMPTY_REGIONS) before its own loop runs (that release went
 * uncounted). */
Test(arena, trim_returns_every_byte_it_released_with_keep)
{
    blk b[80];
    setup s = regions_of_four(b, 20);
    for (int i = 0; i < 4; i++)              /* region 0 empty: cached */
        shim_arena_free_node(s.a, b[i].node);
    shim_arena_counters c = counters(s.a);
    uint64_t before = c.reserved_bytes;
    size_t got = shim_arena_trim(s.a, 1 * MIB);
    c = counters(s.a);
    cr_assert_gt(before - c.reserved_bytes, 0, "this trim released something");
    cr_assert_eq(got, before - c.reserved_bytes, "returned %zu, released %llu", got,
                 (unsigned long long)(before - c.reserved_bytes));
    cr_assert_leq(c.empty_bytes, 1 * MIB);
    for (int i = 4; i < 76; i++)
        shim_arena_free_node(s.a, b[i].node);
    unmake(s);
}

/* ---- regions of their own and exported regions (IPC) ---------------- */

/* A block of its own region: the region is its exact aligned size, never
 * carved for another request; exporting it marks the region, and its free
 * gives the region back at once (never cached for the next block). A
 * block sharing its region is not exportable. */
Test(arena, own_regions_and_exported_regions)
{
    fake *f = fake_new(256 * MIB);
    shim_region_backend be = backend_of(f, 256);
    shim_arena *a = shim_arena_create(&be, 0, 2 * MIB);
    blk small = must_alloc(a, 4 * KIB), small2 = must_alloc(a, 4 * KIB);
    cr_assert_not(shim_arena_export(a, small.addr), "a block sharing its region was exported");

    blk own = { .size = 1000 };
    cr_assert_eq(shim_arena_alloc_own(a, 1000, true, &own.addr, &own.node, &own.block_bytes), 0);
    const range *r = fake_find(f, own.addr);
    cr_assert(r && r->base == own.addr && r->size == 1024,
              "a region of its own is the request's aligned size at the block's address");
    cr_assert_eq(own.block_bytes, 1024);
    /* Nothing else is carved from it. */
    blk other = must_alloc(a, 256);
    cr_assert(other.addr - own.addr >= 1024, "a block was carved from a region of its own");

    /* Freed without export: cached, and taken again by the same size. */
    uint64_t released = counters(a).regions_released;
    shim_arena_free_node(a, own.node);
    blk again = { .size = 1000 };
    cr_assert_eq(shim_arena_alloc_own(a, 1000, false, &again.addr, &again.node,
                                      &again.block_bytes), 0, "the cached region was not reused");
    cr_assert_eq(again.addr, own.addr);
    cr_assert_eq(counters(a).regions_released, released);

    /* Exported: its free gives the region back. */
    cr_assert(shim_arena_export(a, again.addr));
    cr_assert_not(shim_arena_export(a, again.addr + 256), "an export past the block's start");
    size_t reserves = f->reserves;
    shim_arena_free_node(a, again.node);
    blk next = must_alloc(a, 512); /* the arena's next call merges the free */
    cr_assert_eq(counters(a).regions_released, released + 1, "an exported region was kept");
    cr_assert_null(fake_find(f, again.addr), "the exported region is still reserved");
    cr_assert_eq(f->reserves, reserves);
    cr_assert_null(shim_arena_check(a));
    shim_arena_free_node(a, next.node);
    shim_arena_free_node(a, other.node);
    shim_arena_free_node(a, small.node);
    shim_arena_free_node(a, small2.node);
    cr_assert_null(shim_arena_check(a));
    shim_arena_destroy(a);
    free(f);
}
