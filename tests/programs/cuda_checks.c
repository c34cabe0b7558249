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
 *   ipc       cuIpcGetMemHandle of a served block that shares its region is
 *             refused (801; tests/integration/test_cuda_ipc.py: the blocks
 *             that can be exported)
 *   pitch     cuMemAllocPitch rounds to 512 and checks the element size
 *   reset     after cuDevicePrimaryCtxReset (the driver freed the context's
 *             memory), new blocks are live driver memory and keep their bytes
 *   destroy   the same after cuCtxDestroy of a created context
 *   stale     a block of a destroyed context, freed after the driver gave
 *             its address out again, is rejected; a failed large request
 *             (which trims cached regions) leaves the new blocks alive
 *   cross     a block freed from one context while another context's
 *             stream still writes it is not handed out before that work
 *             ran, in either context (run with SPYRESHIM_LIMIT=1M and
 *             CUDASTANDIN_OP_DELAY_US)
 *   attrs     pointer attributes and cuMemGetAddressRange agree on the
 *             block; a freed block is not found and cannot be exported
 *   freeasync cuMemFreeAsync of a served block is the shim's free
 *   peak      1 MiB on device 0, freed, then 1 MiB on device 1 (the test
 *             reads peak_used_bytes from the statistics)
 *   peaksum   1 MiB on device 0 held while 1 MiB on device 1 is allocated
 *             and freed, then freed (the peak of the sum is 2 MiB, above
 *             either device's peak and what is live at exit)
 *   procaddr  cuGetProcAddress hands out the shim's teardown, pointer-query
 *             and stream-ordered-free functions at their ABI versions (the
 *             route of the CUDA runtime); prints "<name>@<version> <object>"
 *   oomexit   1 MiB blocks on device 0 until a request fails, none freed,
 *             then exit(3): a program that fails on its own after an
 *             out-of-memory (prints "oomexit: <the failure's code>") */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "cudadrv.h"



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
    CHECK(rc == CUDA_ERROR_NOT_SUPPORTED, "cuIpcGetMemHandle of a block sharing its region returned %d", rc);
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

/* Allocates n blocks of `size`, writes a distinct pattern into each, reads
 * every one back, frees them: the blocks are live driver memory that no
 * one else writes. Returns a description of the first failure or NULL. */
static const char *blocks_keep_their_bytes(int n, size_t size)
{
    static char why[160];
    CUdeviceptr p[8];
    unsigned char *buf = malloc(size), *back = malloc(size);
    if (!buf || !back || n > 8)
        return "host memory";
    const char *bad = NULL;
    int made = 0;
    for (; made < n && !bad; made++) {
        CUresult rc = cuMemAlloc_v2(&p[made], size);
        if (rc != CUDA_SUCCESS) {
            snprintf(why, sizeof why, "alloc %d: error %d", made, rc);
            bad = why;
            break;
        }
        memset(buf, 0x30 + made, size);
        rc = cuMemcpyHtoD_v2(p[made], buf, size);
        if (rc != CUDA_SUCCESS) {
            snprintf(why, sizeof why, "block %#llx is not live driver memory (copy: %d)", p[made],
                     rc);
            bad = why;
        }
    }
    for (int i = 0; i < made && !bad; i++) {
        memset(buf, 0x30 + i, size);
        if (cuMemcpyDtoH_v2(back, p[i], size) != CUDA_SUCCESS || memcmp(back, buf, size) != 0) {
            snprintf(why, sizeof why, "block %d (%#llx) lost its bytes", i, p[i]);
            bad = why;
        }
    }
    for (int i = 0; i < made; i++)
        cuMemFree_v2(p[i]);
    free(buf);
    free(back);
    return bad;
}

static void check_reset(void)
{
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUdeviceptr a;
    unsigned char buf[4096];
    memset(buf, 0x5a, sizeof buf);
    CHECK(cuMemAlloc_v2(&a, 1 << 20) == CUDA_SUCCESS && cuMemcpyHtoD_v2(a, buf, sizeof buf) == 0,
          "alloc and write before the reset");
    CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS, "reset");
    CHECK(cuDevicePrimaryCtxRetain(&ctx[0], 0) == CUDA_SUCCESS, "retain after the reset");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context after the reset");
    const char *bad = blocks_keep_their_bytes(4, 1 << 20);
    CHECK(!bad, "after the reset: %s", bad);
    printf("reset ok\n");
}

static void check_destroy(void)
{
    CUcontext c;
    CHECK(cuCtxCreate_v2(&c, 0, 0) == CUDA_SUCCESS, "create a context");
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 1 << 20) == CUDA_SUCCESS && cuMemAlloc_v2(&b, 1 << 18) == CUDA_SUCCESS,
          "alloc in the created context");
    CHECK(cuCtxDestroy_v2(c) == CUDA_SUCCESS, "destroy");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set the primary context");
    /* Small enough for what the destroyed context's regions had left. */
    const char *bad = blocks_keep_their_bytes(4, 1 << 17);
    CHECK(!bad, "after the destroy: %s", bad);
    printf("destroy ok\n");
}

static void check_stale(void)
{
    CUcontext c;
    CHECK(cuCtxCreate_v2(&c, 0, 0) == CUDA_SUCCESS, "create a context");
    CUdeviceptr x0, x;
    CHECK(cuMemAlloc_v2(&x0, 1 << 18) == CUDA_SUCCESS && cuMemAlloc_v2(&x, 1 << 18) == CUDA_SUCCESS,
          "alloc in the created context");
    CHECK(cuCtxDestroy_v2(c) == CUDA_SUCCESS, "destroy");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set the primary context");
    /* The driver hands the destroyed context's addresses out again. */
    enum { N = 4, SIZE = 1 << 20 };
    CUdeviceptr y[N];
    unsigned char buf[SIZE], back[SIZE];
    for (int i = 0; i < N; i++) {
        CHECK(cuMemAlloc_v2(&y[i], SIZE) == CUDA_SUCCESS, "alloc y%d", i);
        memset(buf, 0x40 + i, SIZE);
        CHECK(cuMemcpyHtoD_v2(y[i], buf, SIZE) == CUDA_SUCCESS, "y%d (%#llx) is not live", i, y[i]);
    }
    /* The stale pointer: dead, whoever holds its address now. */
    CUresult rc = cuMemFree_v2(x);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "free of a block of a destroyed context: %d", rc);
    /* A request no region can serve: cached regions are given back first. */
    CUdeviceptr huge;
    rc = cuMemAlloc_v2(&huge, (size_t)60 << 20);
    if (rc == CUDA_SUCCESS)
        cuMemFree_v2(huge);
    for (int i = 0; i < N; i++) {
        memset(buf, 0x40 + i, SIZE);
        CHECK(cuMemcpyDtoH_v2(back, y[i], SIZE) == CUDA_SUCCESS && memcmp(back, buf, SIZE) == 0,
              "y%d (%#llx) lost its bytes or its memory", i, y[i]);
        CHECK(cuMemFree_v2(y[i]) == CUDA_SUCCESS, "free y%d", i);
    }
    printf("stale ok\n");
}

/* `owner` allocates the whole 1 MiB its limit allows; `writer`'s stream
 * queues memsets of 0x11 on it; the block is freed from the primary
 * context; then `reuser` asks for 1 MiB, which only that block can serve,
 * and writes 0x22 at once on its legacy stream (which does not wait for a
 * non-blocking stream). */
static const char *cross_round(CUcontext owner, CUcontext writer, CUcontext reuser)
{
    enum { SIZE = 1 << 20, QUEUED = 4 };
    static char why[160];
    static unsigned char pattern[SIZE], back[SIZE];
    CUstream s;
    CUdeviceptr x, y;
    if (cuCtxSetCurrent(owner) || cuMemAlloc_v2(&x, SIZE))
        return "alloc x";
    if (cuCtxSetCurrent(writer) || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING))
        return "stream";
    for (int k = 0; k < QUEUED; k++)
        if (cuMemsetD8Async(x, 0x11, SIZE, s))
            return "memset";
    if (cuCtxSetCurrent(ctx[0]) || cuMemFree_v2(x))
        return "free x from the primary context";
    if (cuCtxSetCurrent(reuser) || cuMemAlloc_v2(&y, SIZE))
        return "alloc y";
    memset(pattern, 0x22, SIZE);
    if (cuMemcpyHtoD_v2(y, pattern, SIZE))
        return "copy into y";
    cuCtxSetCurrent(writer);
    cuStreamSynchronize(s);
    cuStreamDestroy_v2(s);
    cuCtxSetCurrent(reuser);
    if (cuMemcpyDtoH_v2(back, y, SIZE))
        return "copy back";
    if (memcmp(back, pattern, SIZE) != 0) {
        snprintf(why, sizeof why, "y (%#llx, x was %#llx) holds %#x: the other context's queued "
                 "work wrote it after its reuse", y, x, back[0]);
        return why;
    }
    cuMemFree_v2(y);
    return NULL;
}

static void check_cross(void)
{
    CUcontext c;
    CHECK(cuCtxCreate_v2(&c, 0, 0) == CUDA_SUCCESS, "create a context");
    const struct { CUcontext owner, writer, reuser; const char *what; } rounds[] = {
        {c, c, ctx[0], "block of the created context, reused in the primary one"},
        {c, c, c, "block of the created context, reused there"},
        {ctx[0], c, ctx[0], "block of the primary context written by the created one"},
    };
    for (size_t i = 0; i < sizeof rounds / sizeof rounds[0]; i++) {
        const char *bad = cross_round(rounds[i].owner, rounds[i].writer, rounds[i].reuser);
        CHECK(!bad, "%s: %s", rounds[i].what, bad);
    }
    cuCtxDestroy_v2(c);
    printf("cross ok\n");
}

static void check_attrs(void)
{
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUdeviceptr a, b;
    CHECK(cuMemAlloc_v2(&a, 3000) == CUDA_SUCCESS && cuMemAlloc_v2(&b, 5000) == CUDA_SUCCESS,
          "alloc");
    CUdeviceptr start = 0, base = 0;
    size_t size = 0, rsize = 0;
    unsigned long long id_a = 0, id_b = 0;
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, b + 10) == 0 &&
          cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, b + 10) == 0,
          "range attributes");
    CHECK(cuMemGetAddressRange_v2(&base, &rsize, b + 10) == CUDA_SUCCESS, "address range");
    CHECK(start == b && size == 5000 && base == start && rsize == size,
          "attributes say %#llx + %zu, address range %#llx + %zu, block %#llx + 5000", start,
          size, base, rsize, b);
    CHECK(cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, a) == 0 &&
          cuPointerGetAttribute(&id_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, b) == 0 && id_a != id_b,
          "buffer ids %llu and %llu", id_a, id_b);
    int attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                   CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                   CU_POINTER_ATTRIBUTE_CONTEXT};
    CUdeviceptr s2 = 0;
    size_t z2 = 0;
    unsigned long long id2 = 0;
    int ord = -1;
    CUcontext owner = NULL;
    void *data[] = {&s2, &z2, &id2, &ord, &owner};
    CHECK(cuPointerGetAttributes(5, attrs, data, b + 10) == CUDA_SUCCESS, "attributes");
    CHECK(s2 == b && z2 == 5000 && id2 == id_b && ord == 0 && owner == ctx[0],
          "cuPointerGetAttributes: %#llx + %zu id %llu device %d context %p", s2, z2, id2, ord,
          (void *)owner);
    CHECK(cuMemFree_v2(b) == CUDA_SUCCESS, "free b");
    CUresult rc = cuMemGetAddressRange_v2(&base, &rsize, b);
    CHECK(rc == CUDA_ERROR_NOT_FOUND, "address range of a freed block: %d", rc);
    rc = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, b);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "range start of a freed block: %d", rc);
    CUipcMemHandle h;
    rc = cuIpcGetMemHandle(&h, b);
    CHECK(rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_SUPPORTED,
          "cuIpcGetMemHandle of a freed block: %d (the region would be exported)", rc);
    CUdeviceptr b2;
    CHECK(cuMemAlloc_v2(&b2, 5000) == CUDA_SUCCESS, "alloc again");
    unsigned long long id_b2 = 0;
    CHECK(cuPointerGetAttribute(&id_b2, CU_POINTER_ATTRIBUTE_BUFFER_ID, b2) == 0 &&
          id_b2 != id_b && id_b2 != id_a, "buffer id %llu reused (%llu, %llu)", id_b2, id_a, id_b);
    cuMemFree_v2(a);
    cuMemFree_v2(b2);
    printf("attrs ok\n");
}

static void check_freeasync(void)
{
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CUdeviceptr a;
    CHECK(cuMemAlloc_v2(&a, 4096) == CUDA_SUCCESS, "alloc");
    CHECK(cuMemFreeAsync(a, NULL) == CUDA_SUCCESS, "cuMemFreeAsync of a served block");
    CUresult rc = cuMemFree_v2(a);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "second free after cuMemFreeAsync: %d", rc);
    printf("freeasync ok\n");
}

static void check_peak(void)
{
    CUdeviceptr a;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemAlloc_v2(&a, 1 << 20) == CUDA_SUCCESS &&
          cuMemFree_v2(a) == CUDA_SUCCESS, "1 MiB on device 0");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemAlloc_v2(&a, 1 << 20) == CUDA_SUCCESS &&
          cuMemFree_v2(a) == CUDA_SUCCESS, "1 MiB on device 1");
    printf("peak ok\n");
}

static void check_peaksum(void)
{
    CUdeviceptr a, b;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemAlloc_v2(&a, 1 << 20) == CUDA_SUCCESS,
          "1 MiB on device 0");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemAlloc_v2(&b, 1 << 20) == CUDA_SUCCESS &&
          cuMemFree_v2(b) == CUDA_SUCCESS, "1 MiB on device 1 while device 0's is held");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemFree_v2(a) == CUDA_SUCCESS,
          "device 0's freed");
    printf("peaksum ok\n");
}

static void check_procaddr(void)
{
    static const struct { const char *name; int version; cuuint64_t flags; } rows[] = {
        {"cuCtxDestroy", 4000, 0}, {"cuCtxDestroy", 2000, 0},
        {"cuDevicePrimaryCtxReset", 11000, 0}, {"cuDevicePrimaryCtxRelease", 11000, 0},
        {"cuDevicePrimaryCtxRetain", 7000, 0}, {"cuPointerGetAttribute", 4000, 0},
        {"cuPointerGetAttributes", 7000, 0}, {"cuMemFreeAsync", 11020, 0},
        {"cuMemFreeAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
        {"cuMemsetD8", 3020, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult rc = cuGetProcAddress_v2(rows[i].name, &fn, rows[i].version, rows[i].flags, &st);
        Dl_info di;
        const char *obj = rc == CUDA_SUCCESS && fn && dladdr(fn, &di) && di.dli_fname
                              ? strrchr(di.dli_fname, '/') : NULL;
        printf("%s@%d%s %s\n", rows[i].name, rows[i].version, rows[i].flags ? "/ptds" : "",
               obj ? obj + 1 : "none");
    }
    printf("procaddr ok\n");
}

/* Managed and host-pinned memory through the three routes (link time,
 * cuGetProcAddress, dlsym on the driver's handle): the driver serves it,
 * the shim counts it per family (the test reads the statistics). Freed
 * unless `keep`: then one of each family is left for the leak check. */
typedef CUresult (*host_alloc_fn)(void **, size_t);
typedef CUresult (*host_free_fn)(void *);

__attribute__((noinline)) void hostmem_leaked_here(int keep)
{
    CUdeviceptr m0, m1;
    void *pinned, *old, *viaproc, *viadlsym;
    static char registered[65536] __attribute__((aligned(4096)));
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS &&
          cuMemAllocManaged(&m0, 1 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS,
          "managed on device 0");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS &&
          cuMemAllocManaged(&m1, 2 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS,
          "managed on device 1");
    /* Over 4 MiB pinned under a 4 MiB device limit: host memory. */
    CHECK(cuMemHostAlloc(&pinned, 4 << 20, 0) == CUDA_SUCCESS, "cuMemHostAlloc");
    CHECK(cuMemAllocHost(&old, 8192) == CUDA_SUCCESS, "cuMemAllocHost (v1)");
    CHECK(cuMemHostRegister_v2(registered, sizeof registered, 0) == CUDA_SUCCESS,
          "cuMemHostRegister_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress_v2("cuMemAllocHost", &fn, 3020, 0, &st) == CUDA_SUCCESS && fn,
          "cuGetProcAddress(cuMemAllocHost, 3020)");
    CHECK(((host_alloc_fn)fn)(&viaproc, 16384) == CUDA_SUCCESS, "cuMemAllocHost_v2 by proc");
    void *lib = dlopen("libcuda.so", RTLD_LAZY | RTLD_NOLOAD);
    CHECK(lib, "the driver's handle");
    host_alloc_fn by_dlsym = (host_alloc_fn)dlsym(lib, "cuMemAllocHost_v2");
    CHECK(by_dlsym && by_dlsym(&viadlsym, 32768) == CUDA_SUCCESS, "cuMemAllocHost_v2 by dlsym");
    if (keep) {
        printf("%s ok\n", check_name);
        return;
    }
    host_free_fn free_by_dlsym = (host_free_fn)dlsym(lib, "cuMemFreeHost");
    CHECK(free_by_dlsym && free_by_dlsym(viadlsym) == CUDA_SUCCESS, "cuMemFreeHost by dlsym");
    fn = NULL;
    CHECK(cuGetProcAddress_v2("cuMemFreeHost", &fn, 2000, 0, &st) == CUDA_SUCCESS && fn &&
              ((host_free_fn)fn)(viaproc) == CUDA_SUCCESS,
          "cuMemFreeHost by proc");
    CHECK(cuMemFreeHost(pinned) == CUDA_SUCCESS && cuMemFreeHost(old) == CUDA_SUCCESS,
          "cuMemFreeHost");
    CHECK(cuMemHostUnregister(registered) == CUDA_SUCCESS, "cuMemHostUnregister");
    CHECK(cuMemFree_v2(m0) == CUDA_SUCCESS && cuMemFree_v2(m1) == CUDA_SUCCESS,
          "cuMemFree of managed memory");
    /* Unknown pointers: the driver's own answers, unchanged. */
    CUresult rc = cuMemFreeHost(pinned);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "second cuMemFreeHost: %d", rc);
    rc = cuMemHostUnregister(registered);
    CHECK(rc == 713, "second cuMemHostUnregister: %d", rc);
    rc = cuMemFree_v2(m1);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "second cuMemFree of managed memory: %d", rc);
    printf("%s ok\n", check_name);
}

static void check_oomexit(void)
{
    CUdeviceptr p;
    CUresult rc;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "cuCtxSetCurrent");
    for (int n = 0; (rc = cuMemAlloc_v2(&p, 1 << 20)) == CUDA_SUCCESS && n < 4096; n++)
        ;
    printf("%s: %d\n", check_name, rc);
    fflush(stdout);
    exit(3);
}

static void check_hostmem(void)
{
    hostmem_leaked_here(0);
}

static void check_hostleak(void)
{
    hostmem_leaked_here(1);
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
    static const struct named_check checks[] = {
        {"devices", check_devices}, {"streams", check_streams}, {"range", check_range},
        {"ipc", check_ipc}, {"pitch", check_pitch}, {"reset", check_reset},
        {"destroy", check_destroy}, {"stale", check_stale}, {"cross", check_cross},
        {"attrs", check_attrs}, {"freeasync", check_freeasync}, {"peak", check_peak},
        {"peaksum", check_peaksum},
        {"procaddr", check_procaddr}, {"hostmem", check_hostmem}, {"hostleak", check_hostleak},
        {"oomexit", check_oomexit},
    };
    return run_checks(argc, argv, checks, sizeof checks / sizeof checks[0]);
}
