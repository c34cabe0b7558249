/* The live-allocation table against a reference model (a plain array of
 * keys present). Keys look like device pointers: 256-aligned, often
 * consecutive, which is what a weak hash clusters on; some are not
 * aligned, lie above 2^47, or come with node ids of 2^25 and more, which
 * the table keeps apart from its compact slots (its wide entries). An
 * array id -> pointer stands for the arena. SEED=n replays. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "table.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

enum { IDS = 200000 };
static uintptr_t addr_of[IDS]; /* the "arena": node id -> address */

static shim_live_fields fields(uint64_t n)
{
    return shim_live_make(n * 3, 0);
}

static shim_table *table(size_t cap)
{
    shim_table *t = shim_table_create(cap, 8);
    cr_assert_not_null(t);
    return t;
}

Test(table, finds_what_was_inserted_and_forgets_what_was_removed)
{
    shim_table *t = table(4);
    addr_of[7] = 0x7f0000001000;
    shim_live_fields f = fields(77);
    cr_assert_eq(shim_table_add(t, addr_of[7], 7, &f), 0);
    cr_assert_eq(shim_table_count(t), 1);
    cr_assert_eq(shim_table_find(t, 0x7f0000001000), 7);
    cr_assert_eq(shim_table_find(t, 0x7f0000001100), SHIM_TABLE_NONE);
    shim_live_fields out = { 0 };
    cr_assert_eq(shim_table_remove(t, 0x7f0000001000, &out), 7);
    cr_assert_eq(shim_live_seq(&out), 77 * 3);
    cr_assert_eq(shim_table_count(t), 0);
    cr_assert_eq(shim_table_find(t, 0x7f0000001000), SHIM_TABLE_NONE);
    cr_assert_eq(shim_table_remove(t, 0x7f0000001000, &out), SHIM_TABLE_NONE,
                 "a second remove finds nothing");
    shim_table_destroy(t);
}

Test(table, the_null_pointer_and_the_none_id_are_never_stored)
{
    shim_table *t = table(0);
    addr_of[3] = 0;
    cr_assert_eq(shim_table_add(t, 0, 3, NULL), -1);
    cr_assert_eq(shim_table_add(t, 0x1000, SHIM_TABLE_NONE, NULL), -1);
    cr_assert_eq(shim_table_count(t), 0);
    cr_assert_eq(shim_table_find(t, 0), SHIM_TABLE_NONE);
    cr_assert_eq(shim_table_remove(t, 0, NULL), SHIM_TABLE_NONE);
    shim_table_destroy(t);
}

struct visit {
    size_t n;
    uint64_t sum;
};

static void count_visit(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user)
{
    struct visit *v = user;
    cr_assert_eq(ptr, addr_of[id]);
    cr_assert_eq(shim_live_seq(f), (uint64_t)id * 3);
    v->n++;
    v->sum += ptr;
}

Test(table, grows_from_a_tiny_capacity_keeping_every_entry)
{
    shim_table *t = table(1);
    for (uint32_t i = 1; i <= 100000; i++) {
        addr_of[i] = (uintptr_t)i * 256;
        shim_live_fields f = fields(i);
        cr_assert_eq(shim_table_add(t, addr_of[i], i, &f), 0);
    }
    cr_assert_eq(shim_table_count(t), 100000);
    for (uint32_t i = 1; i <= 100000; i++)
        cr_assert_eq(shim_table_find(t, (uintptr_t)i * 256), i, "lost %u", i);
    /* Every entry's fields came along (count_visit checks them). */
    struct visit v = { 0 };
    shim_table_foreach(t, count_visit, &v);
    cr_assert_eq(v.n, 100000);
    cr_assert_geq(shim_table_meta_bytes(t), 100000 * (8 + sizeof(shim_live_fields)));
    shim_table_destroy(t);
}

Test(table, foreach_visits_every_entry_once)
{
    shim_table *t = table(8);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < 5000; i++) {
        addr_of[i] = 0x7f0000000000 + (uintptr_t)i * 4096;
        shim_live_fields f = fields(i);
        shim_table_add(t, addr_of[i], i, &f);
    }
    for (uint32_t i = 0; i < 5000; i += 3)
        shim_table_remove(t, addr_of[i], NULL);
    for (uint32_t i = 0; i < 5000; i++)
        if (i % 3)
            sum += addr_of[i];
    struct visit v = { 0 };
    shim_table_foreach(t, count_visit, &v);
    cr_assert_eq(v.n, shim_table_count(t));
    cr_assert_eq(v.sum, sum);
    shim_table_destroy(t);
}

/* x * inverse == 1 mod 2^64 (Newton's iteration; the multiplier is odd). */
static uint64_t inverse(uint64_t x)
{
    uint64_t y = x;
    for (int i = 0; i < 6; i++)
        y *= 2 - x * y;
    return y;
}

/* Pointers whose hashes agree in their top 32 bits share a home slot in
 * any table of up to 2^32 slots (and are not aligned: wide entries, told
 * apart by their pointers). */
Test(table, pointers_with_equal_tags_are_told_apart_by_their_keys)
{
    const uint64_t phi = 0x9e3779b97f4a7c15ull, inv = inverse(phi);
    shim_table *t = table(16);
    uint64_t h = 0x123456789abc0000ull;
    for (uint32_t i = 0; i < 8; i++) {
        addr_of[i] = (uintptr_t)((h + i) * inv);
        cr_assert_eq((addr_of[i] * phi) >> 32, h >> 32);
        shim_live_fields f = fields(i);
        cr_assert_eq(shim_table_add(t, addr_of[i], i, &f), 0);
    }
    for (uint32_t i = 0; i < 8; i += 2)
        cr_assert_eq(shim_table_remove(t, addr_of[i], NULL), i);
    for (uint32_t i = 0; i < 8; i++)
        cr_assert_eq(shim_table_find(t, addr_of[i]), i % 2 ? i : SHIM_TABLE_NONE, "%u", i);
    cr_assert_eq(shim_table_find(t, (uintptr_t)((h + 9) * inv)), SHIM_TABLE_NONE);
    shim_table_destroy(t);
}

/* The model of random_operations_match_a_reference_model as foreach
 * checks it: node id k or big + k is key k. */
struct model {
    const uint64_t *present;
    const uint32_t *id_now;
    uint32_t big;
    size_t visited;
};

static void model_visit(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user)
{
    struct model *m = user;
    uint32_t k = id >= m->big ? id - m->big : id;
    cr_assert_eq(ptr, addr_of[k]);
    cr_assert_eq(id, m->id_now[k]);
    cr_assert_eq(shim_live_seq(f), m->present[k], "key %u: its fields are stale", k);
    m->visited++;
}

/* Random inserts and removes over a small key space (so that runs form and
 * removals shift them), checked against a presence array after each step.
 * Key k is node id k, or 2^25 + k (too large for a compact slot), chosen
 * at each insertion: an overwrite may move an entry between the two
 * forms. */
Test(table, random_operations_match_a_reference_model)
{
    const char *env = getenv("SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : 0x7ab1e;
    fprintf(stderr, "table random: SEED=%" PRIu64 "\n", seed);
    uint64_t s = seed;
    enum { KEYS = 4096 };
    const uint32_t big = (uint32_t)1 << 25;
    static uint64_t present[KEYS]; /* 0 absent, else the seq stored */
    static uint32_t id_now[KEYS];
    size_t count = 0;
    shim_table *t = table(16);
    for (unsigned k = 0; k < KEYS; k++) {
        /* Mostly clustered keys; some spread over the address space, some
         * above 2^47, some not aligned. */
        if (k < KEYS / 2)
            addr_of[k] = 0x7f0000000000 + (uintptr_t)k * 256;
        else if (k % 4 == 1)
            addr_of[k] = ((uintptr_t)k << 40) | 0x100;
        else if (k % 4 == 2)
            addr_of[k] = ((uintptr_t)k << 32) | 0x208;
        else
            addr_of[k] = ((uintptr_t)k << 32) | 0x200;
    }
    for (unsigned op = 0; op < 400000; op++) {
        unsigned k = (unsigned)(rng_next(&s) % KEYS);
        uintptr_t ptr = addr_of[k];
        if (rng_next(&s) % 2) {
            uint64_t seq = (rng_next(&s) % 1000) + 1;
            shim_live_fields f = shim_live_make(seq, 0);
            uint32_t id = rng_next(&s) % 8 == 0 ? big + k : k;
            /* A present key is given a new entry as the device does: its
             * block freed (removed), then handed out again (added). */
            if (present[k])
                cr_assert_eq(shim_table_remove(t, ptr, NULL), id_now[k], "seed=%" PRIu64, seed);
            else
                count++;
            cr_assert_eq(shim_table_add(t, ptr, id, &f), 0);
            present[k] = seq;
            id_now[k] = id;
        } else {
            shim_live_fields out = { 0 };
            uint32_t id = shim_table_remove(t, ptr, &out);
            cr_assert_eq(id != SHIM_TABLE_NONE, present[k] != 0,
                         "seed=%" PRIu64 " op %u: remove of %#" PRIxPTR, seed, op, ptr);
            if (id != SHIM_TABLE_NONE) {
                cr_assert_eq(id, id_now[k], "seed=%" PRIu64, seed);
                cr_assert_eq(shim_live_seq(&out), present[k], "seed=%" PRIu64, seed);
                present[k] = 0;
                count--;
            }
        }
        cr_assert_eq(shim_table_count(t), count, "seed=%" PRIu64, seed);
        if (op % 4999 == 0) {
            size_t seen = 0;
            for (unsigned j = 0; j < KEYS; j++) {
                uint32_t id = shim_table_find(t, addr_of[j]);
                if (present[j]) {
                    cr_assert(id == id_now[j],
                              "seed=%" PRIu64 " op %u: %#" PRIxPTR " lost or wrong", seed, op,
                              addr_of[j]);
                    seen++;
                } else {
                    cr_assert_eq(id, SHIM_TABLE_NONE, "seed=%" PRIu64 " op %u: %#" PRIxPTR
                                 " resurrected", seed, op, addr_of[j]);
                }
                /* Neither one byte off a key nor a pointer equal to it
                 * in the bits a compact slot keeps is ever found. */
                cr_assert_eq(shim_table_find(t, addr_of[j] + 1), SHIM_TABLE_NONE);
                cr_assert_eq(shim_table_find(t, addr_of[j] + ((uintptr_t)1 << 56)),
                             SHIM_TABLE_NONE);
            }
            cr_assert_eq(seen, count);
            /* Each entry's fields are the last stored for its key. */
            struct model m = { present, id_now, big, 0 };
            shim_table_foreach(t, model_visit, &m);
            cr_assert_eq(m.visited, count, "seed=%" PRIu64 " op %u", seed, op);
        }
    }
    shim_table_destroy(t);
}

struct wide_visit {
    uintptr_t ptr[4];
    uint32_t id[4];
    uint64_t seq[4];
    size_t n;
};

static void wide_visit_one(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user)
{
    struct wide_visit *v = user;
    cr_assert_lt(v->n, 4);
    v->seq[v->n] = shim_live_seq(f);
    v->ptr[v->n] = ptr;
    v->id[v->n++] = id;
}

/* Entries that do not fit a compact slot (an address of 2^47 and above, a
 * pointer off the alignment, a node id of 2^25 and above) live beside
 * compact ones, are reported with their own pointers and ids, and leave
 * no trace once removed. */
Test(table, entries_beyond_a_compact_slot_are_kept_exactly)
{
    shim_table *t = table(4);
    const uintptr_t p[4] = { 0x7f0000001000, (uintptr_t)1 << 47, 0x7f0000001010, 0x7f0000002000 };
    const uint32_t id[4] = { 1, 2, 3, ((uint32_t)1 << 25) + 4 };
    for (int i = 0; i < 4; i++) {
        shim_live_fields f = fields(i + 1);
        cr_assert_eq(shim_table_add(t, p[i], id[i], &f), 0);
    }
    for (int i = 0; i < 4; i++)
        cr_assert_eq(shim_table_find(t, p[i]), id[i], "entry %d", i);
    struct wide_visit v = { 0 };
    shim_table_foreach(t, wide_visit_one, &v);
    cr_assert_eq(v.n, 4);
    for (size_t k = 0; k < v.n; k++) {
        int i = 0;
        while (i < 4 && p[i] != v.ptr[k])
            i++;
        cr_assert_lt(i, 4, "foreach made up %#" PRIxPTR, v.ptr[k]);
        cr_assert_eq(v.id[k], id[i]);
        cr_assert_eq(v.seq[k], (uint64_t)(i + 1) * 3, "entry %d's fields", i);
    }
    /* A pointer removed and added again with another node moves from a
     * compact entry to a wide one and back. */
    cr_assert_eq(shim_table_remove(t, p[0], NULL), id[0]);
    cr_assert_eq(shim_table_add(t, p[0], ((uint32_t)1 << 25) + 9, NULL), 0);
    cr_assert_eq(shim_table_find(t, p[0]), ((uint32_t)1 << 25) + 9);
    cr_assert_eq(shim_table_remove(t, p[3], NULL), id[3]);
    cr_assert_eq(shim_table_add(t, p[3], 5, NULL), 0);
    cr_assert_eq(shim_table_find(t, p[3]), 5);
    cr_assert_eq(shim_table_count(t), 4);
    for (int i = 0; i < 4; i++)
        cr_assert_neq(shim_table_remove(t, p[i], NULL), SHIM_TABLE_NONE, "entry %d", i);
    cr_assert_eq(shim_table_count(t), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(shim_table_find(t, p[i]), SHIM_TABLE_NONE, "entry %d", i);
    shim_table_destroy(t);
}

/* A key of the near-threshold runs: distinct (k times an odd number is a
 * bijection mod 2^32), spread, 256-aligned and below 2^47 (compact). */
static uintptr_t spread_key(unsigned k)
{
    return 0x100000000000 + (uintptr_t)(uint32_t)(k * 2654435761u) * 256;
}

/* Held just under the growth threshold (the longest runs, and tombstones
 * piling up to rebuilds), one removal and one insertion at a time,
 * against the model: `live` keys of `pool`, in a table of `slots` slots
 * that may double once. */
static void near_threshold(uint64_t seed, unsigned live_n, unsigned pool, size_t slots,
                           unsigned check_every)
{
    uint64_t s = seed;
    bool *in = calloc(pool, sizeof *in);
    unsigned *live = calloc(live_n, sizeof *live);
    cr_assert(in && live);
    shim_table *t = table(16);
    for (unsigned i = 0; i < live_n; i++) {
        live[i] = i;
        in[i] = true;
        cr_assert_eq(shim_table_add(t, spread_key(i), i, NULL), 0);
    }
    for (unsigned op = 0; op < 200000; op++) {
        unsigned v = (unsigned)(rng_next(&s) % live_n);
        unsigned k = live[v];
        cr_assert_eq(shim_table_remove(t, spread_key(k), NULL), k, "seed=%" PRIu64 " op %u",
                     seed, op);
        in[k] = false;
        unsigned n;
        do
            n = (unsigned)(rng_next(&s) % pool);
        while (in[n]);
        in[n] = true;
        live[v] = n;
        cr_assert_eq(shim_table_add(t, spread_key(n), n, NULL), 0);
        cr_assert_eq(shim_table_count(t), live_n);
        if (op % check_every == 0)
            for (unsigned j = 0; j < pool; j++)
                cr_assert_eq(shim_table_find(t, spread_key(j)), in[j] ? j : SHIM_TABLE_NONE,
                             "seed=%" PRIu64 " op %u key %u", seed, op, j);
    }
    /* The slots doubled once at most (the tombstones of a table this near
     * its limit): the fields (by node id, below `pool`) and the header
     * aside, the table is at most 2 * `slots` slots. */
    size_t fields = 1024;
    while (fields < pool)
        fields *= 2;
    cr_assert_lt(shim_table_meta_bytes(t), 2 * slots * 8 + fields * sizeof(shim_live_fields) + 4096);
    shim_table_destroy(t);
    free(in);
    free(live);
}

/* Removals leave tombstones: a long churn of fresh keys at a steady count
 * grows the array once at most (1,000 live keys are near a 2,048-slot
 * table's limit), then rebuilds it at its size when they pile up, and a
 * key removed is not found past the tombstones of others. */
Test(table, a_long_churn_at_a_steady_count_keeps_the_table_its_size)
{
    shim_table *t = table(16);
    for (unsigned i = 0; i < 1000; i++)
        cr_assert_eq(shim_table_add(t, spread_key(i), i, NULL), 0);
    size_t bytes = 0, first = shim_table_meta_bytes(t);
    for (unsigned k = 1000; k < 300000; k++) {
        if (k == 20000) {
            bytes = shim_table_meta_bytes(t);
            cr_assert_leq(bytes, 2 * first, "grew more than once");
        }
        unsigned gone = k - 1000;
        cr_assert_eq(shim_table_remove(t, spread_key(gone), NULL), gone % 1000, "key %u", gone);
        cr_assert_eq(shim_table_find(t, spread_key(gone)), SHIM_TABLE_NONE, "key %u", gone);
        cr_assert_eq(shim_table_add(t, spread_key(k), k % 1000, NULL), 0);
    }
    cr_assert_eq(shim_table_count(t), 1000);
    for (unsigned k = 0; k < 300000; k++)
        cr_assert_eq(shim_table_find(t, spread_key(k)), k >= 299000 ? k % 1000 : SHIM_TABLE_NONE,
                     "key %u", k);
    cr_assert_eq(shim_table_meta_bytes(t), bytes, "the slots grew under churn");
    shim_table_destroy(t);
}

/* 4,090 live in 8,192 slots: a load of 0.499 (a small table grows past
 * 1/2). SEED=n replays. */
Test(table, stays_exact_at_loads_near_one_half)
{
    const char *env = getenv("SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : 0x3a4;
    fprintf(stderr, "table near 1/2: SEED=%" PRIu64 "\n", seed);
    near_threshold(seed, 4090, 12000, 8192, 9973);
}

/* 196,000 live in 2^18 slots: a load of 0.748 (a table of more than
 * 2^16 slots grows past 3/4). SEED=n replays. */
Test(table, stays_exact_at_loads_near_three_quarters_when_large)
{
    const char *env = getenv("SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : 0x3a5;
    fprintf(stderr, "table near 3/4: SEED=%" PRIu64 "\n", seed);
    near_threshold(seed, 196000, 400000, (size_t)1 << 18, 9973);
}
