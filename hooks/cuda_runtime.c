/* The CUDA runtime's entry points (libcudart, shared), for runtimes that do
 * not reach the driver through cuGetProcAddress (the stand-in libcudart of
 * the tests; a runtime whose driver table the shim did not see). The real
 * CUDA runtime does: once it has fetched cuMemAlloc_v2 from the shim's
 * cuGetProcAddress, its cudaMalloc is served by the driver route
 * (cuda_driver.c) and these wrappers pass straight through, so a block is
 * served once. Devices are shared with the driver route ("cuda:N").
 *
 * cudaError_t is an int-sized enum: cudaErrorInvalidValue = 1,
 * cudaErrorMemoryAllocation = 2. cudaMalloc guarantees 256-byte alignment,
 * so the shim's blocks keep it. */
#include <stdatomic.h>

#include "cuda.h"
#include "hooks.h"

#define CUDA_ENTRY_POINTS(X) \
    X(MALLOC, cudaMalloc)    \
    X(FREE, cudaFree)        \
    X(MEMINFO, cudaMemGetInfo)

/* Optional runtime functions: resolved once, NULL when absent. */
static int (*real_get_device)(int *);
static int (*real_set_device)(int);
static int (*real_device_synchronize)(void);
static _Atomic bool optional_resolved;

static void resolve_optional(void)
{
    if (atomic_load_explicit(&optional_resolved, memory_order_acquire))
        return;
    /* Racing threads resolve the same values; the flag publishes them. */
    *(void **)&real_get_device = shim_resolve_real("cudaGetDevice");
    *(void **)&real_set_device = shim_resolve_real("cudaSetDevice");
    *(void **)&real_device_synchronize = shim_resolve_real("cudaDeviceSynchronize");
    atomic_store_explicit(&optional_resolved, true, memory_order_release);
}

static int current_device(int *ordinal)
{
    resolve_optional();
    *ordinal = 0;
    return real_get_device ? real_get_device(ordinal) : 0;
}

static int sync_device(int ordinal)
{
    resolve_optional();
    if (!real_device_synchronize)
        return 0; /* a runtime without asynchronous work */
    int cur = 0;
    if (current_device(&cur) == 0 && cur == ordinal)
        return real_device_synchronize();
    if (!real_set_device)
        return 0;
    int rc = real_set_device(ordinal);
    if (rc == 0)
        rc = real_device_synchronize();
    real_set_device(cur);
    return rc;
}

static bool pass_through(void)
{
    return shim_cuda_driver_routed() || shim_device_in_backend();
}

SHIM_HOOK_RUNTIME_EX("cuda", CUDA_ENTRY_POINTS, 1, 2, 256, current_device, sync_device,
                     pass_through)
