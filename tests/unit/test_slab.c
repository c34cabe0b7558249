/* The slab (shim/alloc/slab.c): objects aligned to a cache line, each
 * handed out once until pushed back, and the blocks wholly free given
 * back by a sweep while the others stay. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "slab.h"

typedef struct obj {
    void *link;
    char bytes[112];
} obj;

/* Objects taken from new blocks until n are had. */
static size_t take(shim_slab_cache *c, void **out, size_t n)
{
    size_t k = 0;
    while (k < n) {
        void *o = shim_slab_pop(c);
        if (!o) {
            void *b = shim_slab_new(c);
            cr_assert_not_null(b);
            shim_slab_add(c, b);
            continue;
        }
        out[k++] = o;
    }
    return k;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

Test(slab, objects_are_line_aligned_distinct_and_zero_at_first)
{
    shim_slab_cache c = SHIM_SLAB_CACHE_INIT(sizeof(obj));
    cr_assert_eq(c.stride, 128u);
    enum { N = 1000 };
    void **got = malloc(N * sizeof *got);
    take(&c, got, N);
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq((uintptr_t)got[i] % 64, 0);
        const obj *o = got[i];
        for (size_t j = 0; j < sizeof o->bytes; j++)
            cr_assert_eq(o->bytes[j], 0);
    }
    qsort(got, N, sizeof *got, cmp_ptr);
    for (size_t i = 1; i < N; i++)
        cr_assert_geq((uintptr_t)got[i] - (uintptr_t)got[i - 1], sizeof(obj),
                      "objects overlap");
    cr_assert_eq(c.nobjs - c.nfree, N);
    for (size_t i = 0; i < N; i++)
        shim_slab_push(&c, got[i]);
    shim_slab_free_blocks(shim_slab_sweep(&c));
    cr_assert_eq(c.nobjs, 0);
    cr_assert_eq(c.nfree, 0);
    cr_assert_null(shim_slab_pop(&c));
    free(got);
}

/* After a peak, the blocks whose objects are all free go back; a block
 * with one object still used stays, with its free ones. */
Test(slab, a_sweep_gives_back_wholly_free_blocks_only)
{
    shim_slab_cache c = SHIM_SLAB_CACHE_INIT(sizeof(obj));
    enum { N = 5000 };
    void **got = malloc(N * sizeof *got);
    take(&c, got, N);
    size_t before = c.nobjs;
    void *kept = got[N / 2];
    for (size_t i = 0; i < N; i++)
        if (got[i] != kept)
            shim_slab_push(&c, got[i]);
    cr_assert(shim_slab_sweep_due(&c));
    shim_slab_free_blocks(shim_slab_sweep(&c));
    cr_assert_lt(c.nobjs, before / 4, "the peak's blocks went back");
    cr_assert_gt(c.nobjs, 0, "the block in use stays");
    cr_assert_eq(c.nobjs - c.nfree, 1, "one object in use");
    cr_assert_not(shim_slab_sweep_due(&c));
    /* What stays is still handed out, and not the object in use. */
    size_t free_left = c.nfree;
    for (size_t i = 0; i < free_left; i++) {
        void *o = shim_slab_pop(&c);
        cr_assert_not_null(o);
        cr_assert_neq(o, kept);
    }
    cr_assert_null(shim_slab_pop(&c));
    free(got);
}
