/* A driver-API client of the kind the CUDA runtime is: linked with -lcuda,
 * it also fetches cuGetProcAddress through cuGetProcAddress_v2 at 12000
 * and resolves its memory functions through that pointer at ABI version
 * 3020, as the runtime does (docs: shared/design/cuda.md). It allocates on
 * every device, copies a pattern through device memory and back, frees,
 * and prints one summary line. Exit status 0 only if every check held, so
 * a test (or a shim preloaded over the driver) can rely on it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*info_fn)(size_t *, size_t *);

static int failures;

static void check(CUresult rc, const char *what)
{
    if (rc != CUDA_SUCCESS) {
        const char *name = NULL;
        cuGetErrorName(rc, &name);
        fprintf(stderr, "cudadrv_client: %s failed: %d (%s)\n", what, rc, name ? name : "?");
        failures++;
    }
}

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)1 << 20;
    getproc_fn getproc = NULL;
    alloc_fn mem_alloc = NULL;
    free_fn mem_free = NULL;
    info_fn mem_info = NULL;
    CUdriverProcAddressQueryResult st;

    check(cuGetProcAddress_v2("cuGetProcAddress", (void **)&getproc, 12000, 0, &st),
          "cuGetProcAddress_v2(cuGetProcAddress)");
    if (!getproc)
        return 1;
    check(getproc("cuMemAlloc", (void **)&mem_alloc, 3020, 0, &st), "lookup cuMemAlloc");
    check(getproc("cuMemFree", (void **)&mem_free, 3020, 0, &st), "lookup cuMemFree");
    check(getproc("cuMemGetInfo", (void **)&mem_info, 3020, 0, &st), "lookup cuMemGetInfo");
    if (!mem_alloc || !mem_free || !mem_info)
        return 1;

    check(cuInit(0), "cuInit");
    int ndev = 0;
    check(cuDeviceGetCount(&ndev), "cuDeviceGetCount");
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst)
        return 1;
    for (size_t i = 0; i < bytes; i++)
        src[i] = (unsigned char)(i * 7 + 3);

    size_t copied = 0;
    for (int d = 0; d < ndev; d++) {
        CUcontext ctx;
        check(cuDevicePrimaryCtxRetain(&ctx, d), "cuDevicePrimaryCtxRetain");
        check(cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent");
        size_t free0 = 0, free1 = 0, total = 0;
        check(mem_info(&free0, &total), "cuMemGetInfo");
        CUdeviceptr a = 0, b = 0;
        check(mem_alloc(&a, bytes), "cuMemAlloc a");
        check(mem_alloc(&b, bytes), "cuMemAlloc b");
        check(mem_info(&free1, &total), "cuMemGetInfo");
        if (free1 + 2 * bytes > free0) {
            fprintf(stderr, "cudadrv_client: device %d: free went %zu -> %zu\n", d, free0, free1);
            failures++;
        }
        memset(dst, 0, bytes);
        check(cuMemcpyHtoD_v2(a, src, bytes), "cuMemcpyHtoD");
        check(cuMemcpyDtoD_v2(b, a, bytes), "cuMemcpyDtoD");
        check(cuMemcpyDtoH_v2(dst, b, bytes), "cuMemcpyDtoH");
        if (memcmp(src, dst, bytes) != 0) {
            fprintf(stderr, "cudadrv_client: device %d: data differs after the round trip\n", d);
            failures++;
        } else {
            copied += bytes;
        }
        check(mem_free(a), "cuMemFree a");
        check(mem_free(b), "cuMemFree b");
        check(mem_info(&free1, &total), "cuMemGetInfo");
        if (free1 != free0) {
            fprintf(stderr, "cudadrv_client: device %d: %zu bytes not given back\n", d,
                    free0 - free1);
            failures++;
        }
        CUcontext popped;
        check(cuCtxPopCurrent_v2(&popped), "cuCtxPopCurrent");
        check(cuDevicePrimaryCtxRelease_v2(d), "cuDevicePrimaryCtxRelease");
    }
    printf("cudadrv_client: devices=%d bytes_per_device=%zu copied=%zu failures=%d\n",
           ndev, bytes, copied, failures);
    free(src);
    free(dst);
    return failures || ndev == 0 ? 1 : 0;
}
