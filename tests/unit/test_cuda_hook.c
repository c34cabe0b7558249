/* hooks/cuda.c against a stand-in CUDA runtime (tests/cuda_standin), run
 * with LD_PRELOAD=libspyreshim.so and SPYRESHIM_LIMIT=64M by meson test:
 * the program calls cudaMalloc & co. as an application would. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "spyreshim.h"

int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);
int cudaMemGetInfo(size_t *free, size_t *total);
int standinRawMalloc(void **ptr, size_t size);
extern unsigned standin_mallocs, standin_frees, standin_null_frees, standin_forced_failures;

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
    cr_assert_eq(n, 64, "%zu requests of 1 MiB served under a 64 MiB limit", n);
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

Test(cuda_hook, a_wild_pointer_the_runtime_rejects_is_an_invalid_free)
{
    cr_assert_eq(cudaFree((void *)(uintptr_t)0x12345600), 1);
    spyreshim_stats s = shim_stats();
    cr_assert_eq(s.invalid_frees, 1);
    cr_assert_eq(s.foreign_frees, 0);
}

Test(cuda_hook, a_request_above_half_the_address_space_is_a_failed_allocation)
{
    void *p;
    cr_assert_eq(cudaMalloc(&p, SIZE_MAX), 2);
    cr_assert_eq(cudaMalloc(&p, (SIZE_MAX >> 1) + 1), 2);
    cr_assert_eq(shim_stats().failed_allocs, 2);
}

Test(cuda_hook, an_error_other_than_out_of_memory_is_returned_at_once)
{
    /* cudaErrorInsufficientDriver and cudaErrorStubLibrary: no pressure
     * event, no OOM report, one call to the runtime, its own error. */
    static const int codes[] = {35, 34};
    for (int i = 0; i < 2; i++) {
        char v[8];
        snprintf(v, sizeof v, "%d", codes[i]);
        setenv("CUDA_STANDIN_FAIL", v, 1);
        unsigned calls = standin_forced_failures;
        void *p = NULL;
        cr_assert_eq(cudaMalloc(&p, 4 * MB), codes[i]);
        cr_assert_eq(standin_forced_failures, calls + 1, "the shim retried a final error");
        unsetenv("CUDA_STANDIN_FAIL");
    }
    spyreshim_stats s = shim_stats();
    cr_assert_eq(s.pressure_events, 0);
    cr_assert_eq(s.failed_allocs, 2);
    void *p;
    cr_assert_eq(cudaMalloc(&p, 4 * MB), 0, "the runtime works again");
    cr_assert_eq(cudaFree(p), 0);
}
