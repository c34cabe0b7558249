/* Size classes of the region allocator: the bin math alone, as pure
 * functions, so that it can be tested apart from the arena (test_bins.c).
 *
 * Sizes are counted in units of the backend's alignment. A size u below
 * SL_COUNT units has a bin of its own; above, a bin is a power-of-two range
 * [2^e, 2^(e+1)) split into SL_COUNT equal sub-bins, so a bin's lower bound
 * is within 1/SL_COUNT of any size in it. The arena rounds every request up
 * to the lower bound of the next bin (bin_ceil), so that any free block
 * filed under that bin or above fits without a search inside the bin. */
#ifndef SHIM_BINS_H
#define SHIM_BINS_H

#include <stdint.h>

#ifndef SHIM_ARENA_SL_BITS
#define SHIM_ARENA_SL_BITS 6
#endif
#define SL_BITS SHIM_ARENA_SL_BITS
#define SL_COUNT (1u << SL_BITS)
#define FL_COUNT (64 - SL_BITS + 1)
#define BIN_COUNT (FL_COUNT * SL_COUNT)

/* The bin a free block of `u` units is filed under: the largest bin whose
 * lower bound is <= u. */
static inline uint32_t bin_floor(uint64_t u)
{
    if (u < SL_COUNT)
        return (uint32_t)u;
    unsigned fl = 63u - (unsigned)__builtin_clzll(u);
    unsigned shift = fl - SL_BITS;
    uint32_t mant = (uint32_t)(u >> shift) & (SL_COUNT - 1);
    return ((fl - SL_BITS + 1) << SL_BITS) | mant;
}

/* The lower bound of bin `b`, in units. */
static inline uint64_t bin_size(uint32_t b)
{
    uint32_t e = b >> SL_BITS, m = b & (SL_COUNT - 1);
    if (e == 0)
        return m;
    return (uint64_t)(SL_COUNT | m) << (e - 1);
}

/* The smallest bin whose every block holds `u` units: what a request of
 * `u` units is rounded up to (bin_size(bin_ceil(u)) >= u). */
static inline uint32_t bin_ceil(uint64_t u)
{
    uint32_t b = bin_floor(u);
    return bin_size(b) < u ? b + 1 : b;
}

#endif
