/* Driver-API checks of the shim's CUDA layer, run against the stand-in
 * driver (tests/cudadrv) under LD_PRELOAD=libspyreshim.so by
 * tests/integration/test_cuda_driver.py. One check per argument; each
 * prints "<check> ok" or "<check> FAIL: why" and the exit status is the
 * number of failures. Linked with -lcuda: calls reach the shim's exported
 * wrappers at link time, as a program built against the driver does.
 *
 *   devices   blocks are served from the current device; no block of one
 *             device is ever used on the other; frees work whatever
 *             context is current
 *   streams   a block freed while a non-blocking stream still has work
 *             queued on it is not handed out again before that work ran
 *   range     cuMemGetAddressRange of an interior pointer of a served block
 *             describes the block, not the region it was carved from
 *   ipc       cuIpcGetMemHandle of a served block is refused
 *   pitch     cuMemAllocPitch rounds to 512 and checks the element size */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"

static int failures;

#define CHECK(cond, ...)                                  \
    do {                                                  \
        if (!(cond)) {                                    \
            printf("%s FAIL: ", check_name);              \
            printf(__VA_ARGS__);                          \
            printf("\n");                                 \
            failures++;                                   \
            return;                                       \
        }                                                 \
    } while (0)

static const char *check_name;
static CUcontext ctx[2];

static int ordinal_of(CUdeviceptr p)
{
    int ordinal = -1;
    if (cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != CUDA_SUCCESS)
        return -1;
    return ordinal;
}

static void check_devices(void)
{
    enum { N = 64 };
    CUdeviceptr blocks[2][N];
    unsigned char host[4096];
    for (int i = 0; i < N; i++) {
        for (int dev = 0; dev < 2; dev++) {
            CHECK(cuCtxSetCurrent(ctx[dev]) == CUDA_SUCCESS, "set context %d", dev);
            size_t size = 4096 + (size_t)i * 512;
            CHECK(cuMemAlloc_v2(&blocks[dev][i], size) == CUDA_SUCCESS, "alloc on %d", dev);
            CHECK(ordinal_of(blocks[dev][i]) == dev, "block %#llx of device %d is on device %d",
                  blocks[dev][i], dev, ordinal_of(blocks[dev][i]));
            /* The stand-in refuses a copy to another device's pointer. */
            memset(host, dev + i, sizeof host);
            CHECK(cuMemcpyHtoD_v2(blocks[dev][i], host, sizeof host) == CUDA_SUCCESS,
                  "copy into block %d of device %d", i, dev);
        }
    }
    for (int i = 0; i < N; i++) {
        for (int dev = 0; dev < 2; dev++) {
            CHECK(cuCtxSetCurrent(ctx[dev]) == CUDA_SUCCESS, "set context");
            unsigned char back[4096];
            CHECK(cuMemcpyDtoH_v2(back, blocks[dev][i], sizeof back) == CUDA_SUCCESS, "copy back");
            for (size_t k = 0; k < sizeof back; k++)
                CHECK(back[k] == (unsigned char)(dev + i), "block %d of device %d corrupted", i, dev);
        }
    }
    /* Free every block with the OTHER device's context current. */
    for (int dev = 0; dev < 2; dev++) {
        CHECK(cuCtxSetCurrent(ctx[1 - dev]) == CUDA_SUCCESS, "set context");
        for (int i = 0; i < N; i++)
            CHECK(cuMemFree_v2(blocks[dev][i]) == CUDA_SUCCESS, "free block %d of device %d from "
                  "device %d", i, dev, 1 - dev);
    }
    size_t free0, total0, free1, total1;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemGetInfo_v2(&free0, &total0) == 0, "info");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemGetInfo_v2(&free1, &total1) == 0, "info");
    CHECK(total0 != total1, "per-device totals %zu and %zu (capacities differ)", total0, total1);
    printf("devices ok\n");
}

static void check_streams(void)
{
    /* After the free of `a`, NEW blocks of its size are allocated and
     * written at once: an allocator that reuses a freed block without
     * waiting hands out `a`'s hole among them (it is the best fit, and
     * whatever list a freed block goes to, NEW requests reach it), and the
     * memsets still queued on it overwrite that block's data. */
    enum { SIZE = 1 << 16, QUEUED = 6, NEW = 8 };
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    static unsigned char pattern[SIZE], back[SIZE];
    for (int round = 0; round < 8; round++) {
        CUdeviceptr x, a, y, b[NEW];
        /* `a` between two live blocks: once free, its hole is the best fit
         * for a request of its size. */
        CHECK(cuMemAlloc_v2(&x, SIZE) == CUDA_SUCCESS && cuMemAlloc_v2(&a, SIZE) == CUDA_SUCCESS &&
              cuMemAlloc_v2(&y, SIZE) == CUDA_SUCCESS, "alloc x, a, y");
        /* Work on `a` the device runs later (each queued operation waits
         * CUDASTANDIN_OP_DELAY_US first). */
        for (int k = 0; k < QUEUED; k++)
            CHECK(cuMemsetD8Async(a, 0xAA, SIZE, s) == CUDA_SUCCESS, "memset a");
        CHECK(cuMemFree_v2(a) == CUDA_SUCCESS, "free a");
        /* The legacy stream does not wait for a non-blocking one: if a
         * block below were `a`'s, the memsets still queued would overwrite
         * what is written here. */
        for (int i = 0; i < NEW; i++) {
            CHECK(cuMemAlloc_v2(&b[i], SIZE) == CUDA_SUCCESS, "alloc b%d", i);
            memset(pattern, 0x10 + i, sizeof pattern);
            CHECK(cuMemcpyHtoD_v2(b[i], pattern, SIZE) == CUDA_SUCCESS, "copy into b%d", i);
        }
        CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS, "sync");
        for (int i = 0; i < NEW; i++) {
            memset(pattern, 0x10 + i, sizeof pattern);
            CHECK(cuMemcpyDtoH_v2(back, b[i], SIZE) == CUDA_SUCCESS, "copy back b%d", i);
            CHECK(memcmp(back, pattern, SIZE) == 0,
                  "round %d: b%d (%#llx) was overwritten by work queued on a (%#llx) before its free",
                  round, i, b[i], a);
        }
        for (int i = 0; i < NEW; i++)
            CHECK(cuMemFree_v2(b[i]) == CUDA_SUCCESS, "free b%d", i);
        CHECK(cuMemFree_v2(x) == CUDA_SUCCESS && cuMemFree_v2(y) == CUDA_SUCCESS, "free x, y");
    }
    cuStreamDestroy_v2(s);
    printf("streams ok\n");
}

static void check_range(void)
{
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUdeviceptr a, b, base = 0;
    size_t size = 0;
    CHECK(cuMemAlloc_v2(&a, 3000) == CUDA_SUCCESS && cuMemAlloc_v2(&b, 5000) == CUDA_SUCCESS,
          "alloc");
    CHECK(cuMemGetAddressRange_v2(&base, &size, b + 100) == CUDA_SUCCESS, "range");
    CHECK(base == b && size == 5000, "range of b+100: base %#llx size %zu, want %#llx 5000", base,
          size, b);
    CHECK(cuMemGetAddressRange_v2(&base, NULL, a) == CUDA_SUCCESS && base == a, "range of a");
    cuMemFree_v2(a);
    cuMemFree_v2(b);
    printf("range ok\n");
}

static void check_ipc(void)
{
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUdeviceptr a;
    CUipcMemHandle h;
    CHECK(cuMemAlloc_v2(&a, 1 << 20) == CUDA_SUCCESS, "alloc");
    CUresult rc = cuIpcGetMemHandle(&h, a);
    CHECK(rc == CUDA_ERROR_NOT_SUPPORTED, "cuIpcGetMemHandle of a served block returned %d", rc);
    cuMemFree_v2(a);
    printf("ipc ok\n");
}

static void check_pitch(void)
{
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUdeviceptr p;
    size_t pitch = 0;
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 7, 4) == CUDA_SUCCESS, "pitch alloc");
    CHECK(pitch == 1024, "pitch %zu for width 1000", pitch);
    CUdeviceptr base;
    size_t size;
    CHECK(cuMemGetAddressRange_v2(&base, &size, p) == CUDA_SUCCESS && size == 1024 * 7,
          "pitched block size %zu", size);
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 7, 3) == CUDA_ERROR_INVALID_VALUE,
          "element size 3 accepted");
    cuMemFree_v2(base);
    printf("pitch ok\n");
}

int main(int argc, char **argv)
{
    if (cuInit(0) != CUDA_SUCCESS) {
        printf("cuInit failed\n");
        return 100;
    }
    for (int dev = 0; dev < 2; dev++)
        if (cuDevicePrimaryCtxRetain(&ctx[dev], dev) != CUDA_SUCCESS) {
            printf("no device %d\n", dev);
            return 100;
        }
    static const struct { const char *name; void (*fn)(void); } checks[] = {
        {"devices", check_devices}, {"streams", check_streams}, {"range", check_range},
        {"ipc", check_ipc}, {"pitch", check_pitch},
    };
    for (int i = 1; i < argc; i++) {
        size_t k = 0;
        while (k < sizeof checks / sizeof checks[0] && strcmp(checks[k].name, argv[i]) != 0)
            k++;
        if (k == sizeof checks / sizeof checks[0]) {
            printf("%s: unknown check\n", argv[i]);
            failures++;
            continue;
        }
        check_name = argv[i];
        checks[k].fn();
    }
    fflush(stdout);
    return failures;
}
