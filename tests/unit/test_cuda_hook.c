/* hooks/cuda.c against a stand-in CUDA runtime (tests/cuda_standin), run
 * with LD_PRELOAD=libspyreshim.so and SPYRESHIM_LIMIT=64M by meson test:
 * the program calls cudaMalloc & co. as an application would. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>

#include "spyreshim.h"

int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);
int cudaMemGetInfo(size_t *free, size_t *total);
int standinRawMalloc(void **ptr, size_t size);
extern unsigned standin_mallocs, standin_frees, standin_null_frees;

#define MB ((size_t)1 << 20)

static spyreshim_stats shim_stats(void)
{
    int (*get)(spyreshim_stats *) = (int (*)(spyreshim_stats *))dlsym(RTLD_DEFAULT, "spyreshim_get_stats");
    cr_assert_not_null(get, "libspyreshim.so is not preloaded");
    spyreshim_stats s = {.size = sizeof s};
    cr_assert_eq(get(&s), 0);
    return s;
}

Test(cuda_hook, allocations_are_served_from_regions)
{
    void *p[100];
    for (int i = 0; i < 100; i++)
        cr_assert_eq(cudaMalloc(&p[i], 64 * 1024), 0);
    cr_assert_eq(shim_stats().allocs, 100);
    /* A handful of regions, not one runtime call per allocation. */
    cr_assert_leq(standin_mallocs, 8, "%u allocations reached the runtime", standin_mallocs);
    for (int i = 0; i < 100; i++) {
        cr_assert_eq((uintptr_t)p[i] % 256, 0);
        cr_assert_eq(cudaFree(p[i]), 0);
    }
    cr_assert_eq(shim_stats().frees, 100);
}

Test(cuda_hook, out_of_memory_is_cudaErrorMemoryAllocation_at_the_limit)
{
    void *p;
    int rc;
    size_t n = 0;
    while ((rc = cudaMalloc(&p, MB)) == 0)
        n++;
    cr_assert_eq(rc, 2);
    cr_assert_geq(n, 60, "only %zu MiB under a 64 MiB limit", n);
    cr_assert_leq(n, 64);
}

Test(cuda_hook, mem_get_info_reports_the_limit)
{
    size_t f, t;
    cr_assert_eq(cudaMemGetInfo(&f, &t), 0);
    cr_assert_eq(t, 64 * MB);
    cr_assert_leq(f, t);
    void *p;
    cr_assert_eq(cudaMalloc(&p, 16 * MB), 0);
    size_t f2, t2;
    cr_assert_eq(cudaMemGetInfo(&f2, &t2), 0);
    cr_assert_leq(f2, f - 16 * MB);
    cr_assert_eq(cudaMemGetInfo(NULL, &t2), 1);
}

Test(cuda_hook, foreign_pointers_go_to_the_real_cudaFree)
{
    void *raw;
    cr_assert_eq(standinRawMalloc(&raw, 4096), 0);
    unsigned frees = standin_frees;
    cr_assert_eq(cudaFree(raw), 0);
    cr_assert_eq(standin_frees, frees + 1);
    cr_assert_eq(shim_stats().foreign_frees, 1);
    unsigned nulls = standin_null_frees;
    cr_assert_eq(cudaFree(NULL), 0);
    cr_assert_eq(standin_null_frees, nulls + 1, "cudaFree(0) must reach the runtime");
}

Test(cuda_hook, double_free_is_invalid_value)
{
    void *p;
    cr_assert_eq(cudaMalloc(&p, MB), 0);
    cr_assert_eq(cudaFree(p), 0);
    cr_assert_eq(cudaFree(p), 1);
    cr_assert_eq(shim_stats().invalid_frees, 1);
}
