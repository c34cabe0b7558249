/* The live-allocation table against a reference model (a plain array of
 * keys present). Keys look like device pointers: 256-aligned, often
 * consecutive, which is what a weak hash clusters on. SEED=n replays. */
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

static shim_record rec(uintptr_t ptr, uint64_t size)
{
    return (shim_record){ .ptr = ptr, .size = size, .seq = size * 3, .node = (uint32_t)size,
                          .native_stack = 1, .python_stack = 2, .flags = 4 };
}

Test(table, finds_what_was_inserted_and_forgets_what_was_removed)
{
    shim_table *t = shim_table_create(4);
    cr_assert_not_null(t);
    shim_record r = rec(0x7f0000001000, 77);
    cr_assert_eq(shim_table_insert(t, &r), 0);
    cr_assert_eq(shim_table_count(t), 1);
    const shim_record *f = shim_table_find(t, 0x7f0000001000);
    cr_assert_not_null(f);
    cr_assert_eq(f->size, 77);
    cr_assert_eq(f->seq, 231);
    cr_assert_eq(f->node, 77);
    cr_assert_eq(f->python_stack, 2);
    cr_assert_null(shim_table_find(t, 0x7f0000001100));
    shim_record out = { 0 };
    cr_assert(shim_table_remove(t, 0x7f0000001000, &out));
    cr_assert_eq(out.size, 77);
    cr_assert_eq(out.flags, 4);
    cr_assert_eq(shim_table_count(t), 0);
    cr_assert_null(shim_table_find(t, 0x7f0000001000));
    cr_assert_not(shim_table_remove(t, 0x7f0000001000, &out), "a second remove finds nothing");
    shim_table_destroy(t);
}

Test(table, inserting_an_existing_pointer_overwrites_its_record)
{
    shim_table *t = shim_table_create(0);
    shim_record a = rec(0x1000, 1), b = rec(0x1000, 2);
    cr_assert_eq(shim_table_insert(t, &a), 0);
    cr_assert_eq(shim_table_insert(t, &b), 0);
    cr_assert_eq(shim_table_count(t), 1);
    cr_assert_eq(shim_table_find(t, 0x1000)->size, 2);
    shim_table_destroy(t);
}

Test(table, the_null_pointer_is_never_stored)
{
    shim_table *t = shim_table_create(0);
    shim_record z = rec(0, 1);
    cr_assert_eq(shim_table_insert(t, &z), -1);
    cr_assert_eq(shim_table_count(t), 0);
    cr_assert_null(shim_table_find(t, 0));
    cr_assert_not(shim_table_remove(t, 0, NULL));
    shim_table_destroy(t);
}

Test(table, grows_from_a_tiny_capacity_keeping_every_record)
{
    shim_table *t = shim_table_create(1);
    for (uintptr_t i = 1; i <= 100000; i++) {
        shim_record r = rec(i * 256, i);
        cr_assert_eq(shim_table_insert(t, &r), 0);
    }
    cr_assert_eq(shim_table_count(t), 100000);
    for (uintptr_t i = 1; i <= 100000; i++) {
        const shim_record *f = shim_table_find(t, i * 256);
        cr_assert_not_null(f, "lost %#" PRIxPTR " in growth", i * 256);
        cr_assert_eq(f->size, i);
    }
    shim_table_destroy(t);
}

typedef struct visit {
    size_t n;
    uint64_t sum;
} visit;

static void count_visit(const shim_record *r, void *user)
{
    visit *v = user;
    v->n++;
    v->sum += r->size;
}

Test(table, foreach_visits_every_record_once)
{
    shim_table *t = shim_table_create(8);
    uint64_t sum = 0;
    for (uintptr_t i = 1; i <= 1000; i++) {
        shim_record r = rec(0x7f0000000000 + i * 4096, i);
        shim_table_insert(t, &r);
        sum += i;
    }
    for (uintptr_t i = 1; i <= 1000; i += 3) {
        shim_table_remove(t, 0x7f0000000000 + i * 4096, NULL);
        sum -= i;
    }
    visit v = { 0 };
    shim_table_foreach(t, count_visit, &v);
    cr_assert_eq(v.n, shim_table_count(t));
    cr_assert_eq(v.sum, sum);
    shim_table_destroy(t);
}

/* Random inserts and removes over a small key space (so that runs form and
 * removals shift them), checked against a presence array after each step. */
Test(table, random_operations_match_a_reference_model)
{
    const char *env = getenv("SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : 0x7ab1e;
    fprintf(stderr, "table random: SEED=%" PRIu64 "\n", seed);
    uint64_t s = seed;
    enum { KEYS = 4096 };
    static uint64_t present[KEYS]; /* 0 absent, else the size stored */
    size_t count = 0;
    shim_table *t = shim_table_create(16);
    for (unsigned op = 0; op < 400000; op++) {
        unsigned k = (unsigned)(rng_next(&s) % KEYS);
        /* Mostly clustered keys, some spread over the address space. */
        uintptr_t ptr = k < KEYS / 2 ? 0x7f0000000000 + (uintptr_t)k * 256
                                     : ((uintptr_t)k << 32) | 0x200;
        if (rng_next(&s) % 2) {
            uint64_t size = (rng_next(&s) % 1000) + 1;
            shim_record r = rec(ptr, size);
            cr_assert_eq(shim_table_insert(t, &r), 0);
            if (!present[k])
                count++;
            present[k] = size;
        } else {
            shim_record out = { 0 };
            bool had = shim_table_remove(t, ptr, &out);
            cr_assert_eq(had, present[k] != 0, "seed=%" PRIu64 " op %u: remove of %#" PRIxPTR, seed,
                         op, ptr);
            if (had) {
                cr_assert_eq(out.size, present[k], "seed=%" PRIu64, seed);
                present[k] = 0;
                count--;
            }
        }
        cr_assert_eq(shim_table_count(t), count, "seed=%" PRIu64, seed);
        if (op % 4999 == 0) {
            for (unsigned j = 0; j < KEYS; j++) {
                uintptr_t p = j < KEYS / 2 ? 0x7f0000000000 + (uintptr_t)j * 256
                                           : ((uintptr_t)j << 32) | 0x200;
                const shim_record *f = shim_table_find(t, p);
                if (present[j])
                    cr_assert(f && f->size == present[j],
                              "seed=%" PRIu64 " op %u: %#" PRIxPTR " lost or wrong", seed, op, p);
                else
                    cr_assert_null(f, "seed=%" PRIu64 " op %u: %#" PRIxPTR " resurrected", seed, op, p);
            }
        }
    }
    shim_table_destroy(t);
}
