/* The records of memory the shim passes through (shim/alloc/passthrough.c):
 * what a free takes off when an address was handed out again before the
 * free was told (a stream-ordered pool reuses a block at once). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "passthrough.h"

Test(passthrough, a_free_takes_the_oldest_record_of_its_address)
{
    uintptr_t p = 0x7f0000100000;
    /* Thread 1's block; the driver freed it and gave it to thread 2,
     * which recorded it before thread 1's free was told. */
    shim_passthrough_add(SHIM_PT_ASYNC, 0, p, 100);
    shim_passthrough_add(SHIM_PT_ASYNC, 0, p, 200);
    cr_assert(shim_passthrough_remove(SHIM_PT_ASYNC, p));
    size_t n = 0;
    shim_pt_record *live = shim_passthrough_live(0, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(live[0].size, 200, "thread 2's block is live, not thread 1's");
    free(live);
    shim_pt_counters c;
    shim_passthrough_totals(SHIM_PT_ASYNC, &c);
    cr_assert_eq(c.bytes, 200);
    cr_assert_eq(c.allocs, 2);
    cr_assert_eq(c.frees, 1);
    cr_assert(shim_passthrough_remove(SHIM_PT_ASYNC, p));
    cr_assert_not(shim_passthrough_remove(SHIM_PT_ASYNC, p), "nothing left");
    cr_assert_not(shim_passthrough_remove(SHIM_PT_MANAGED, p), "another family's");
    shim_passthrough_totals(SHIM_PT_ASYNC, &c);
    cr_assert_eq(c.bytes, 0);
}

/* The table doubles as records come (passthrough.c's grow): the records
 * of an address keep their order (a free takes the oldest, an unref the
 * newest) across the moves, and four threads adding, retaining and
 * releasing at once while it grows leave nothing counted. */
Test(passthrough, the_order_of_an_address_survives_the_table_growing)
{
    uintptr_t p = 0x7f0000200000;
    shim_passthrough_add(SHIM_PT_ASYNC, 0, p, 100);
    for (uintptr_t i = 1; i <= 5000; i++)
        shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p + i * 64, 64);
    shim_passthrough_add(SHIM_PT_ASYNC, 0, p, 200);
    cr_assert(shim_passthrough_remove(SHIM_PT_ASYNC, p));
    for (uintptr_t i = 1; i <= 5000; i++)
        cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, p + i * 64), 0);
    size_t n = 0;
    shim_pt_record *live = shim_passthrough_live(0, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(live[0].size, 200, "the newer record of p is live, not the older");
    free(live);
}

static void *churn(void *arg)
{
    uintptr_t base = 0x7f1000000000 + (uintptr_t)arg * 0x10000000;
    for (uintptr_t i = 0; i < 4000; i++) {
        shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, base + i * 256, 256);
        if (i % 3 == 0)
            shim_passthrough_retain(SHIM_PT_OPENCL_MEM, base + i * 256);
    }
    long bad = 0;
    for (uintptr_t i = 0; i < 4000; i++) {
        if (i % 3 == 0 && shim_passthrough_unref(SHIM_PT_OPENCL_MEM, base + i * 256) != 1)
            bad++;
        if (shim_passthrough_unref(SHIM_PT_OPENCL_MEM, base + i * 256) != 0)
            bad++;
    }
    return (void *)bad;
}

Test(passthrough, four_threads_while_the_table_grows_leave_nothing_counted)
{
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, churn, (void *)i), 0);
    for (int i = 0; i < 4; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        cr_assert_eq((long)bad, 0, "thread %d: a count went wrong", i);
    }
    shim_pt_counters c;
    shim_passthrough_totals(SHIM_PT_OPENCL_MEM, &c);
    cr_assert_eq(c.allocs, 16000);
    cr_assert_eq(c.frees, 16000);
    cr_assert_eq(c.bytes, 0);
    cr_assert_eq(c.peak_bytes >= 4000 * 256, 1);
    cr_assert_not(shim_passthrough_any(SHIM_PT_OPENCL_MEM));
}

/* Keys a multiplicative hash (x * 0x9E3779B97F4A7C15, its high bits)
 * sends to one place whatever the table's size: i times the inverse of
 * the multiplier (mod 2^64) hashes to i, whose high bits are zeros (an
 * open-addressing table's worst case, tried on this branch's history;
 * the chained table hashes ptr >> 4: then spread, still told apart). */
static uintptr_t colliding(uint64_t i)
{
    const uint64_t k = 0x9E3779B97F4A7C15ull;
    uint64_t inv = k; /* Newton's iteration: each step doubles the good bits */
    for (int s = 0; s < 6; s++)
        inv *= 2 - k * inv;
    return (uintptr_t)(i * inv);
}

Test(passthrough, many_colliding_addresses_are_told_apart)
{
    enum { N = 300 };
    for (uint64_t i = 1; i <= N; i++)
        shim_passthrough_add(SHIM_PT_OPENCL_SVM, 0, colliding(i), i);
    for (uint64_t i = 1; i <= N; i += 2) /* every other one, in the middle of the others */
        cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_SVM, colliding(i)), 0);
    for (uint64_t i = 1; i <= N; i++)
        cr_assert_eq(shim_passthrough_contains(SHIM_PT_OPENCL_SVM, colliding(i)), i % 2 == 0,
                     "record %lu", (unsigned long)i);
    /* New colliding records, looked up among the others. */
    for (uint64_t i = 1; i <= N; i += 2)
        shim_passthrough_add(SHIM_PT_OPENCL_SVM, 0, colliding(i), i);
    shim_pt_counters c;
    shim_passthrough_totals(SHIM_PT_OPENCL_SVM, &c);
    cr_assert_eq(c.bytes, (uint64_t)N * (N + 1) / 2);
    for (uint64_t i = N; i >= 1; i--)
        cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_SVM, colliding(i)), 0);
    shim_passthrough_totals(SHIM_PT_OPENCL_SVM, &c);
    cr_assert_eq(c.bytes, 0);
    cr_assert_not(shim_passthrough_any(SHIM_PT_OPENCL_SVM));
}

/* Records of one address (twins) among others that go: an unref takes
 * the newest, a free the oldest, wherever the removals left them. */
Test(passthrough, twins_are_taken_by_age_while_others_go)
{
    uintptr_t p = colliding(7);
    for (uint64_t i = 1; i <= 6; i++)
        shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, colliding(i), 1);
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 10);
    for (uint64_t i = 1; i <= 6; i++)
        cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, colliding(i)), 0);
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 20);
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 30);
    cr_assert(shim_passthrough_retain(SHIM_PT_OPENCL_MEM, p)); /* the newest: 30 */
    cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, p), 1);
    cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, p), 0);
    cr_assert(shim_passthrough_remove(SHIM_PT_OPENCL_MEM, p)); /* the oldest: 10 */
    size_t n = 0;
    shim_pt_record *live = shim_passthrough_live(0, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(live[0].size, 20);
    free(live);
    cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, p), 0);
    cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, p), -1);
}

/* Create and release pairs of many distinct addresses around records
 * that live all along: those are still found. */
Test(passthrough, many_pairs_around_live_records_do_not_lose_them)
{
    uintptr_t base = 0x7f3000000000;
    for (uintptr_t i = 0; i < 10; i++)
        shim_passthrough_add(SHIM_PT_MANAGED, 0, base + i * 4096, 4096);
    for (uintptr_t i = 0; i < 200000; i++) {
        uintptr_t q = 0x7f4000000000 + i * 64;
        shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, q, 64);
        cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, q), 0);
    }
    for (uintptr_t i = 0; i < 10; i++)
        cr_assert(shim_passthrough_remove(SHIM_PT_MANAGED, base + i * 4096));
    cr_assert_not(shim_passthrough_any(SHIM_PT_MANAGED));
    cr_assert_not(shim_passthrough_any(SHIM_PT_OPENCL_MEM));
}

/* Four threads each creating and releasing colliding addresses while a
 * fifth's records make the table grow. */
static void *collide(void *arg)
{
    long t = (long)arg, bad = 0;
    for (uint64_t round = 0; round < 2000; round++) {
        uint64_t i = 1000 + (uint64_t)t * 16 + round % 16;
        shim_passthrough_add(SHIM_PT_OPENCL_SVM, 0, colliding(i), 8);
        if (shim_passthrough_unref(SHIM_PT_OPENCL_SVM, colliding(i)) != 0)
            bad++;
    }
    return (void *)bad;
}

static void *grower(void *arg)
{
    (void)arg;
    for (uintptr_t i = 0; i < 20000; i++)
        shim_passthrough_add(SHIM_PT_HOST_PINNED, -1, 0x7f5000000000 + i * 64, 64);
    return NULL;
}

Test(passthrough, colliding_threads_while_the_table_grows)
{
    pthread_t t[5];
    for (long i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, collide, (void *)i), 0);
    cr_assert_eq(pthread_create(&t[4], NULL, grower, NULL), 0);
    for (int i = 0; i < 5; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        cr_assert_eq((long)bad, 0, "thread %d: a release found no record", i);
    }
    shim_pt_counters c;
    shim_passthrough_totals(SHIM_PT_OPENCL_SVM, &c);
    cr_assert_eq(c.allocs, 8000);
    cr_assert_eq(c.frees, 8000);
    cr_assert_not(shim_passthrough_any(SHIM_PT_OPENCL_SVM));
    for (uintptr_t i = 0; i < 20000; i++)
        cr_assert(shim_passthrough_remove(SHIM_PT_HOST_PINNED, 0x7f5000000000 + i * 64));
}

/* A release told after the runtime's (clReleaseMemObject's order): the
 * runtime freed the object, another thread made one at its address and
 * recorded it; the release takes the record made before it was called,
 * not the newer one. */
Test(passthrough, a_release_told_after_the_runtime_takes_the_record_made_before_it)
{
    uintptr_t p = 0x7f4000000000;
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 100);
    cr_assert(shim_passthrough_retain(SHIM_PT_OPENCL_MEM, p));
    uint32_t before = shim_passthrough_order();
    cr_assert_eq(shim_passthrough_unref_before(SHIM_PT_OPENCL_MEM, p, before), 1);
    before = shim_passthrough_order();
    /* The runtime freed it; another thread's new object, same address. */
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 200);
    cr_assert_eq(shim_passthrough_unref_before(SHIM_PT_OPENCL_MEM, p, before), 0);
    size_t n = 0;
    shim_pt_record *live = shim_passthrough_live(0, &n);
    cr_assert_eq(n, 1);
    cr_assert_eq(live[0].size, 200, "the new object's record is live, not the released one's");
    cr_assert_eq(live[0].refs, 1);
    free(live);
    cr_assert_eq(shim_passthrough_unref_before(SHIM_PT_OPENCL_MEM, p, before), -1,
                 "nothing of p was recorded before that read but what went");
    cr_assert_eq(shim_passthrough_unref(SHIM_PT_OPENCL_MEM, p), 0);
    shim_pt_counters c;
    shim_passthrough_totals(SHIM_PT_OPENCL_MEM, &c);
    cr_assert_eq(c.bytes, 0);
    cr_assert_eq(c.frees, 2);
}

/* The order wraps (32 bits): a release still takes the record made
 * before its read once the counter went round. */
Test(passthrough, the_order_compares_across_its_wrap)
{
    atomic_store(&shim_pt_order, UINT32_MAX - 1);
    uintptr_t p = 0x7f5000000000;
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 100); /* order 2^32 - 2 */
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p + 64, 1); /* 2^32 - 1 */
    uint32_t before = shim_passthrough_order();
    cr_assert_eq(before, 0u);
    shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, p, 200); /* 0: after the read */
    cr_assert_eq(shim_passthrough_unref_before(SHIM_PT_OPENCL_MEM, p, before), 0);
    size_t n = 0;
    shim_pt_record *live = shim_passthrough_live(0, &n);
    cr_assert_eq(n, 2);
    for (size_t i = 0; i < n; i++)
        cr_assert(live[i].size == 200 || live[i].size == 1);
    free(live);
}

/* A VMM record's node, mapped, then gone, is the next record's: that one
 * has no mappings (the node's are cleared on the way back). */
Test(passthrough, a_node_reused_after_a_mapped_record_has_no_mappings)
{
    uintptr_t h = 0x7f6000000000;
    shim_passthrough_add(SHIM_PT_VMM, 0, h, 4096);
    shim_passthrough_mapped(SHIM_PT_VMM, h, 0x7f7000000000, 4096);
    cr_assert(shim_passthrough_release(SHIM_PT_VMM, h), "kept while mapped");
    cr_assert_eq(shim_passthrough_unmapped(SHIM_PT_VMM, 0x7f7000000000, 4096), 1);
    cr_assert_not(shim_passthrough_contains(SHIM_PT_VMM, h));
    for (uintptr_t i = 0; i < 8; i++)
        shim_passthrough_add(SHIM_PT_OPENCL_MEM, 0, h + 64 * (i + 1), 64);
    size_t n = 0;
    shim_pt_record *live = shim_passthrough_live(0, &n);
    cr_assert_eq(n, 8);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(live[i].va, 0);
        cr_assert_eq(live[i].va_size, 0);
        cr_assert_eq(live[i].maps, 0);
        cr_assert_not(live[i].released);
    }
    free(live);
}
