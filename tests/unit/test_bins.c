/* The allocator's size classes (shim/alloc/bins.h), apart from the arena:
 * every size maps to a bin whose bounds bracket it, rounding up never
 * gives less than asked and wastes less than 1/64, and bins are ordered. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "bins.h"

static uint64_t next_u64(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

Test(bins, small_sizes_have_a_bin_each)
{
    for (uint64_t u = 0; u < SL_COUNT; u++) {
        cr_assert_eq(bin_floor(u), u);
        cr_assert_eq(bin_size(bin_floor(u)), u);
        cr_assert_eq(bin_ceil(u), u);
    }
}

Test(bins, floor_brackets_the_size)
{
    for (uint64_t u = 1; u < (1u << 20); u++) {
        uint32_t b = bin_floor(u);
        cr_assert_leq(bin_size(b), u, "u=%lu", (unsigned long)u);
        cr_assert_gt(bin_size(b + 1), u, "u=%lu", (unsigned long)u);
    }
}

Test(bins, ceil_rounds_up_within_one_sixty_fourth)
{
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    cr_log_info("seed %#lx", (unsigned long)seed);
    for (int i = 0; i < 1000000; i++) {
        uint64_t u = (next_u64(&seed) >> (next_u64(&seed) % 33 + 2)) + 1;
        if (u >= ((uint64_t)1 << 31))
            continue;
        uint64_t r = bin_size(bin_ceil(u));
        cr_assert_geq(r, u, "u=%lu", (unsigned long)u);
        /* The rounded size is the next bin's lower bound: at most one
         * sub-bin (1/SL_COUNT of the power of two) above the request. */
        cr_assert_leq((r - u) * SL_COUNT, u, "u=%lu rounded to %lu", (unsigned long)u,
                      (unsigned long)r);
        cr_assert_eq(bin_floor(r), bin_ceil(u));
    }
}

Test(bins, bins_are_ordered_by_size)
{
    for (uint32_t b = 1; b < (FL_COUNT - 30) * SL_COUNT; b++)
        cr_assert_gt(bin_size(b), bin_size(b - 1), "b=%u", b);
}

Test(bins, powers_of_two_start_a_range)
{
    for (unsigned e = SL_BITS; e < 40; e++) {
        uint64_t u = (uint64_t)1 << e;
        uint32_t b = bin_floor(u);
        cr_assert_eq(b & (SL_COUNT - 1), 0u, "2^%u", e);
        cr_assert_eq(bin_size(b), u);
    }
}
