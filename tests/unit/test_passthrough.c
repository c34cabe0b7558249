/* The records of memory the shim passes through (shim/alloc/passthrough.c):
 * what a free takes off when an address was handed out again before the
 * free was told (a stream-ordered pool reuses a block at once). */
#include <criterion/criterion.h>
#include <pthread.h>
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
