/* Allocation + free pairs of one CUDA family the shim passes through and
 * watches, on the driver stand-in (tests/cudadrv), for
 * bench/cuda_passthrough_pair.sh (run under callgrind, with and without
 * the shim: instructions per pair, the stand-in's own included).
 *
 *   cuda_passthrough_pair FAMILY PAIRS
 *
 * FAMILY: device (cuMemAlloc_v2 + cuMemFree_v2 of 64 KiB: the served
 * family, for reference), managed (cuMemAllocManaged + cuMemFree_v2 of
 * 64 KiB), host (cuMemHostAlloc + cuMemFreeHost of 64 KiB), vmm
 * (cuMemCreate + cuMemRelease of 2 MiB, one granule). 16 allocations of the
 * family stay live throughout, so the shim's records are not empty. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"

enum { LIVE = 16 };

typedef unsigned long long u64;

static CUmemAllocationProp prop;

static int alloc1(const char *f, u64 *out)
{
    if (strcmp(f, "device") == 0)
        return cuMemAlloc_v2((CUdeviceptr *)out, 65536);
    if (strcmp(f, "managed") == 0)
        return cuMemAllocManaged((CUdeviceptr *)out, 65536, CU_MEM_ATTACH_GLOBAL);
    if (strcmp(f, "host") == 0) {
        void *p = NULL;
        int rc = cuMemHostAlloc(&p, 65536, 0);
        *out = (u64)(uintptr_t)p;
        return rc;
    }
    return cuMemCreate((CUmemGenericAllocationHandle *)out, (size_t)2 << 20, &prop, 0);
}

static int free1(const char *f, u64 p)
{
    if (strcmp(f, "device") == 0 || strcmp(f, "managed") == 0)
        return cuMemFree_v2(p);
    if (strcmp(f, "host") == 0)
        return cuMemFreeHost((void *)(uintptr_t)p);
    return cuMemRelease(p);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: cuda_passthrough_pair device|managed|host|vmm PAIRS\n");
        return 2;
    }
    const char *f = argv[1];
    long pairs = atol(argv[2]);
    CUcontext ctx;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx))
        return 1;
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    u64 live[LIVE];
    for (int i = 0; i < LIVE; i++)
        if (alloc1(f, &live[i]))
            return 1;
    for (long i = 0; i < pairs; i++) {
        u64 p;
        if (alloc1(f, &p) || free1(f, p))
            return 1;
    }
    for (int i = 0; i < LIVE; i++)
        free1(f, live[i]);
    printf("family=%s pairs=%ld\n", f, pairs);
    return 0;
}
