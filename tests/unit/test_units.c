/* Sizes as text (shim/base/units.c): the one format of every size the
 * shim prints, the same as spyreshim/units.py's (exact bytes, then from
 * 1 KiB the binary-unit reading to one decimal). */
#include <criterion/criterion.h>
#include <stdint.h>

#include "units.h"

static void check(uint64_t n, const char *want)
{
    char buf[SHIM_SIZE_TEXT];
    cr_assert_str_eq(shim_size_text(buf, n), want);
}

Test(units, exact_below_a_kib)
{
    check(0, "0 B");
    check(512, "512 B");
    check(1023, "1023 B");
}

Test(units, bytes_then_the_binary_unit)
{
    check(1024, "1024 B (1.0 KiB)");
    check(1536, "1536 B (1.5 KiB)");
    check(268435456, "268435456 B (256.0 MiB)");
    check(1048575, "1048575 B (1024.0 KiB)");   /* as Python's %.1f rounds it */
    check(3ull << 40, "3298534883328 B (3.0 TiB)");
}

Test(units, the_largest_fits)
{
    check(UINT64_MAX, "18446744073709551615 B (16.0 EiB)");
}
