/* The records of memory the shim passes through (shim/alloc/passthrough.c):
 * what a free takes off when an address was handed out again before the
 * free was told (a stream-ordered pool reuses a block at once). */
#include <criterion/criterion.h>
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
