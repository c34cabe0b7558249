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
#include <stdint.h>
#include <stdlib.h>

#include "cuda.h"
#include "hooks.h"

#define CUDA_ENTRY_POINTS(X) \
    X(MALLOC, cudaMalloc)    \
    X(FREE, cudaFree)        \
    X(MEMINFO, cudaMemGetInfo)

/* Optional runtime functions: resolved once into a table published with
 * one atomic store (racing first callers resolve the same values; the
 * loser's copy is freed). NULL members: absent. */
typedef struct optional {
    int (*get_device)(int *);
    int (*set_device)(int);
    int (*device_synchronize)(void);
} optional;

static _Atomic(optional *) the_optional;
static const optional none; /* out of host memory: treat all as absent */

static const optional *resolve_optional(void)
{
    optional *o = atomic_load_explicit(&the_optional, memory_order_acquire);
    if (o)
        return o;
    optional *mine = calloc(1, sizeof *mine);
    if (!mine)
        return &none;
    *(void **)&mine->get_device = shim_resolve_real("cudaGetDevice");
    *(void **)&mine->set_device = shim_resolve_real("cudaSetDevice");
    *(void **)&mine->device_synchronize = shim_resolve_real("cudaDeviceSynchronize");
    optional *expected = NULL;
    if (atomic_compare_exchange_strong(&the_optional, &expected, mine))
        return mine;
    free(mine);
    return expected;
}

/* The runtime's devices know no contexts (context 0): a runtime that
 * reaches the driver through cuGetProcAddress is served there, by context. */
static int current_device(int *ordinal, uintptr_t *context)
{
    const optional *o = resolve_optional();
    *ordinal = 0;
    *context = 0;
    return o->get_device ? o->get_device(ordinal) : 0;
}

static int sync_device(int ordinal, uintptr_t context)
{
    (void)context;
    const optional *o = resolve_optional();
    if (!o->device_synchronize)
        return 0; /* a runtime without asynchronous work */
    int cur = 0;
    uintptr_t none;
    if (current_device(&cur, &none) == 0 && cur == ordinal)
        return o->device_synchronize();
    if (!o->set_device)
        return 0;
    int rc = o->set_device(ordinal);
    if (rc == 0)
        rc = o->device_synchronize();
    o->set_device(cur);
    return rc;
}

static bool pass_through(void)
{
    return shim_cuda_driver_routed() || shim_device_in_backend();
}

SHIM_HOOK_RUNTIME_EX("cuda", CUDA_ENTRY_POINTS, 1, 2, 256, current_device, sync_device,
                     pass_through)
