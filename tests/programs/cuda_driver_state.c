/* The driver's state (contexts, pools, mappings) against what the shim
 * answers: each check does what a program may do and prints only the
 * driver's answers (return codes, bytes read back, never an address), so
 * that tests/integration/test_cuda_driver_state.py can run it without and
 * with LD_PRELOAD=libspyreshim.so and compare the two outputs. Run against
 * the stand-in driver (tests/cudadrv); linked with -lcuda. One check per
 * argument; each prints "<check> ok" or "<check> FAIL: why"; the exit
 * status is the number of failures.
 *
 *   unserved     a block of the primary context, written by memsets queued
 *                in a created context that never allocated, is freed and a
 *                new block of its size is written at once: the new owner
 *                reads its own bytes (run with SPYRESHIM_LIMIT=1M, so that
 *                only the freed block can serve it, and
 *                CUDASTANDIN_OP_DELAY_US)
 *   poolinold    a stream-ordered allocation the driver places where a
 *                destroyed context's memory was: its address range, pointer
 *                attribute and cuMemFreeAsync are the driver's answers
 *   destroyprim  cuCtxDestroy of a primary context is refused (201); the
 *                context's blocks stay live: read back, their range, freed
 *   releaseextra a release of a primary context retained once more than the
 *                program released keeps it; a release past the count is
 *                refused and keeps the blocks
 *   popped       a created context popped, then destroyed while no longer
 *                current: its block is freed with no context current, the
 *                driver's answers before and after
 *   elsewhere    a created context destroyed while current on another thread:
 *                that thread's allocation, memory info and synchronization
 *                are refused (709, as cuCtxDestroy documents), the free of
 *                the context's block too (the driver freed it)
 *   vmmtwice     one handle mapped at two addresses, both unmapped, released:
 *                nothing left (the leak check's exit status tells)
 *   vmmpartial   one handle mapped in two halves at two addresses, one
 *                cuMemUnmap covering both, released
 *   vmmretain    a handle retained from its mapping (the same value), both
 *                references released: the memory lives until the unmapping
 *                ("vmmretain <bytes> <rc>": a cuMemCreate while it lives and
 *                one after; under SPYRESHIM_LIMIT=4M the first is refused)
 *   vmmadjacent  two handles mapped side by side, both released while mapped,
 *                the first unmapped: the second's memory lives until its own
 *                unmapping ("vmmadjacent <bytes> <rc>": a cuMemCreate while
 *                it lives and one after; under SPYRESHIM_LIMIT=4M the first
 *                is refused)
 *   vmmretainlate a handle released while mapped, then retained from its
 *                mapping and unmapped: the retained reference keeps the
 *                memory until its release ("vmmretainlate <bytes> <rc>", as
 *                vmmadjacent)
 *   poolother    cuMemAllocFromPoolAsync from device 1's default pool and
 *                from a pool made on device 1, and cuMemAllocAsync on a
 *                stream of device 1, while device 0's context is current:
 *                prints the answers ("other|made|stream <bytes> <rc>", and
 *                the current context after the stream's allocation;
 *                under SPYRESHIM_LIMIT the test expects device 1's limit)
 *   poolpeer     1 MiB served on device 0, then 4 MiB from a pool made on
 *                device 1 that device 0 was given read-write access to
 *                ("poolpeer <bytes> <rc>"; under SPYRESHIM_LIMIT=4M the test
 *                expects the calling context's device charged: whose a
 *                shared pool's memory is, the driver does not say)
 *   queries      the driver's answers the shim asks: cuMemPoolGetAccess of
 *                each device to a pool, cuStreamGetCtx of a stream and of
 *                the default one, cuMemRetainAllocationHandle of an
 *                unmapped address
 *   vmmother     cuMemCreate of device 1 while device 0's context is current
 *                ("vmmother <bytes> <rc>") */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "cudadrv.h"

#define MiB ((size_t)1 << 20)

static CUcontext ctx[2];

static void check_unserved(void)
{
    enum { QUEUED = 4 };
    static unsigned char pattern[MiB], back[MiB];
    CUcontext writer;
    CUstream s;
    CUdeviceptr x, y;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemAlloc_v2(&x, MiB) == CUDA_SUCCESS,
          "alloc x in the primary context");
    /* The created context allocates nothing: the shim never served in it. */
    CHECK(cuCtxCreate_v2(&writer, 0, 0) == CUDA_SUCCESS, "create a context");
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    for (int k = 0; k < QUEUED; k++)
        CHECK(cuMemsetD8Async(x, 0x11, MiB, s) == CUDA_SUCCESS, "memset x from the created context");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemFree_v2(x) == CUDA_SUCCESS, "free x");
    CHECK(cuMemAlloc_v2(&y, MiB) == CUDA_SUCCESS, "alloc y");
    memset(pattern, 0x22, MiB);
    CHECK(cuMemcpyHtoD_v2(y, pattern, MiB) == CUDA_SUCCESS, "write y");
    CHECK(cuCtxSetCurrent(writer) == CUDA_SUCCESS && cuStreamSynchronize(s) == CUDA_SUCCESS &&
          cuStreamDestroy_v2(s) == CUDA_SUCCESS, "the created context's work done");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemcpyDtoH_v2(back, y, MiB) == CUDA_SUCCESS,
          "read y");
    CHECK(memcmp(back, pattern, MiB) == 0,
          "y holds %#x where its owner wrote 0x22: work queued before x's free wrote it", back[0]);
    CHECK(cuMemFree_v2(y) == CUDA_SUCCESS, "free y");
    CHECK(cuCtxDestroy_v2(writer) == CUDA_SUCCESS, "destroy the created context");
    printf("%s ok\n", check_name);
}

static void check_poolinold(void)
{
    CUcontext c;
    CUdeviceptr a, p, base = 0, start = 0;
    size_t size = 0;
    /* The created context's block lies at the start of the device's
     * memory (nothing else is allocated there yet), and its teardown gives
     * that memory back. */
    CHECK(cuCtxCreate_v2(&c, 0, 0) == CUDA_SUCCESS, "create a context");
    CHECK(cuMemAlloc_v2(&a, 64 << 10) == CUDA_SUCCESS, "alloc in the created context");
    CHECK(cuCtxDestroy_v2(c) == CUDA_SUCCESS, "destroy it");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "the primary context");
    CHECK(cuMemAllocAsync(&p, 64 << 10, NULL) == CUDA_SUCCESS, "cuMemAllocAsync");
    printf("in the old range: %d\n", p == a);
    CUresult rc = cuMemGetAddressRange_v2(&base, &size, p + 100);
    printf("cuMemGetAddressRange: %d, base %s, size %zu\n", rc, base == p ? "p" : "not p", size);
    rc = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 100);
    printf("cuPointerGetAttribute: %d, start %s\n", rc, start == p ? "p" : "not p");
    printf("cuMemFree_v2: %d\n", cuMemFree_v2(p));
    printf("cuMemFreeAsync: %d\n", cuMemFreeAsync(p, NULL));
    printf("cuMemFreeAsync again: %d\n", cuMemFreeAsync(p, NULL));
    printf("cuMemFree_v2 of the destroyed context's block: %d\n", cuMemFree_v2(a));
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "synchronize");
    printf("%s ok\n", check_name);
}

/* A block of `size` written with `byte`, for the checks that it stays. */
static CUresult written(CUdeviceptr *p, size_t size, unsigned char byte)
{
    static unsigned char buf[MiB];
    CUresult rc = cuMemAlloc_v2(p, size);
    if (rc)
        return rc;
    memset(buf, byte, size);
    return cuMemcpyHtoD_v2(*p, buf, size);
}

static const char *still(CUdeviceptr p, size_t size, unsigned char byte)
{
    static unsigned char buf[MiB];
    CUdeviceptr base = 0;
    size_t got = 0;
    if (cuMemcpyDtoH_v2(buf, p, size) != CUDA_SUCCESS)
        return "copy back failed";
    for (size_t i = 0; i < size; i++)
        if (buf[i] != byte)
            return "lost its bytes";
    if (cuMemGetAddressRange_v2(&base, &got, p) != CUDA_SUCCESS || base != p || got != size)
        return "its address range is not the block";
    return NULL;
}

static void check_destroyprim(void)
{
    CUdeviceptr a;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && written(&a, 4096, 0x5a) == CUDA_SUCCESS,
          "alloc in the primary context");
    printf("cuCtxDestroy_v2 of the primary context: %d\n", cuCtxDestroy_v2(ctx[0]));
    printf("cuCtxDestroy of the primary context: %d\n", cuCtxDestroy(ctx[0]));
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "the primary context is still there");
    const char *bad = still(a, 4096, 0x5a);
    CHECK(!bad, "the block %s", bad);
    printf("cuMemFree_v2: %d\n", cuMemFree_v2(a));
    printf("%s ok\n", check_name);
}

static void check_popped(void)
{
    CUcontext c, popped = NULL;
    CUdeviceptr a, b;
    CHECK(cuCtxCreate_v2(&c, 0, 1) == CUDA_SUCCESS, "create a context on device 1");
    CHECK(written(&a, 4096, 0x77) == CUDA_SUCCESS, "alloc in it");
    CUresult rc = cuCtxPopCurrent_v2(&popped);
    printf("pop: %d, the created one: %d\n", rc, popped == c);
    printf("pop again: %d\n", cuCtxPopCurrent_v2(&popped));
    printf("alloc with no context: %d\n", cuMemAlloc_v2(&b, 4096));
    printf("free the popped context's block with none: %d\n", cuMemFree_v2(a));
    printf("destroy the popped context: %d\n", cuCtxDestroy_v2(c));
    printf("free again: %d\n", cuMemFree_v2(a));
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    printf("%s ok\n", check_name);
}

/* The other thread of check_elsewhere: the created context current, its
 * block allocated, then (once main destroyed the context) the answers. */
static struct {
    CUcontext c;
    CUdeviceptr a;
    pthread_barrier_t made, destroyed;
    CUresult alloc, info, sync, free_rc;
} elsewhere;

static void *elsewhere_thread(void *unused)
{
    (void)unused;
    CUdeviceptr b;
    size_t free_b, total;
    cuCtxSetCurrent(elsewhere.c);
    pthread_barrier_wait(&elsewhere.made);
    pthread_barrier_wait(&elsewhere.destroyed);
    elsewhere.alloc = cuMemAlloc_v2(&b, 4096);
    elsewhere.info = cuMemGetInfo_v2(&free_b, &total);
    elsewhere.sync = cuCtxSynchronize();
    elsewhere.free_rc = cuMemFree_v2(elsewhere.a);
    return NULL;
}

static void check_elsewhere(void)
{
    pthread_t t;
    CHECK(cuCtxCreate_v2(&elsewhere.c, 0, 0) == CUDA_SUCCESS, "create a context");
    CHECK(written(&elsewhere.a, 4096, 0x66) == CUDA_SUCCESS, "alloc in it");
    pthread_barrier_init(&elsewhere.made, NULL, 2);
    pthread_barrier_init(&elsewhere.destroyed, NULL, 2);
    CHECK(pthread_create(&t, NULL, elsewhere_thread, NULL) == 0, "thread");
    pthread_barrier_wait(&elsewhere.made);
    printf("destroy while current on another thread: %d\n", cuCtxDestroy_v2(elsewhere.c));
    pthread_barrier_wait(&elsewhere.destroyed);
    pthread_join(t, NULL);
    printf("there: alloc %d, info %d, synchronize %d, free of its block %d\n", elsewhere.alloc,
           elsewhere.info, elsewhere.sync, elsewhere.free_rc);
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    printf("%s ok\n", check_name);
}

static void check_releaseextra(void)
{
    CUdeviceptr a;
    CUcontext again;
    /* Retained twice (main and here), released once: it stays. */
    CHECK(cuDevicePrimaryCtxRetain(&again, 1) == CUDA_SUCCESS && again == ctx[1], "retain");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && written(&a, 4096, 0x3c) == CUDA_SUCCESS,
          "alloc in device 1's primary context");
    printf("release: %d\n", cuDevicePrimaryCtxRelease_v2(1));
    const char *bad = still(a, 4096, 0x3c);
    CHECK(!bad, "after a release that keeps the context, the block %s", bad);
    /* The reset of another device's context leaves this one's blocks. */
    printf("reset of device 0: %d\n", cuDevicePrimaryCtxReset_v2(0));
    bad = still(a, 4096, 0x3c);
    CHECK(!bad, "after another device's reset, the block %s", bad);
    printf("reset of device 7: %d\n", cuDevicePrimaryCtxReset_v2(7));
    printf("release of device 7: %d\n", cuDevicePrimaryCtxRelease_v2(7));
    bad = still(a, 4096, 0x3c);
    CHECK(!bad, "after refused resets and releases, the block %s", bad);
    printf("cuMemFree_v2: %d\n", cuMemFree_v2(a));
    printf("%s ok\n", check_name);
}

static CUmemAllocationProp vmm_prop(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static void check_vmmtwice(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CHECK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemCreate(&h, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "map at the first address");
    CHECK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "map at the second");
    printf("unmap the first: %d\n", cuMemUnmap(va, 2 * MiB));
    printf("unmap the second: %d\n", cuMemUnmap(va + 2 * MiB, 2 * MiB));
    printf("release: %d\n", cuMemRelease(h));
    /* Mapped twice again, released first, then unmapped in one call. */
    CHECK(cuMemCreate(&h, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create again");
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0) == CUDA_SUCCESS &&
          cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "map twice again");
    printf("release while mapped: %d\n", cuMemRelease(h));
    printf("unmap the second: %d\n", cuMemUnmap(va + 2 * MiB, 2 * MiB));
    printf("unmap the first: %d\n", cuMemUnmap(va, 2 * MiB));
    CHECK(cuMemAddressFree(va, 4 * MiB) == CUDA_SUCCESS, "free the reservation");
    printf("%s ok\n", check_name);
}

static void check_vmmpartial(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CHECK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemCreate(&h, 4 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    CHECK(cuMemMap(va, 2 * MiB, 2 * MiB, h, 0) == CUDA_SUCCESS, "map the second half first");
    CHECK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "then the first half");
    printf("release: %d\n", cuMemRelease(h));
    printf("unmap both: %d\n", cuMemUnmap(va, 4 * MiB));
    CHECK(cuMemAddressFree(va, 8 * MiB) == CUDA_SUCCESS, "free the reservation");
    printf("%s ok\n", check_name);
}

static void check_vmmretain(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h, again = 0, more;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CHECK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemCreate(&h, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "map");
    CUresult rc = cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)(va + 4096));
    printf("retain: %d, the same handle: %d\n", rc, again == h);
    printf("release: %d\n", cuMemRelease(h));
    printf("release the retained: %d\n", cuMemRelease(again));
    printf("release once more: %d\n", cuMemRelease(h));
    /* Still mapped: the 2 MiB are live until the unmapping. */
    rc = cuMemCreate(&more, 4 * MiB, &prop, 0);
    printf("vmmretain 4194304 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("release %d\n", cuMemRelease(more));
    printf("unmap: %d\n", cuMemUnmap(va, 2 * MiB));
    rc = cuMemCreate(&more, 4 * MiB, &prop, 0);
    printf("vmmretain 4194304 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("release %d\n", cuMemRelease(more));
    CHECK(cuMemAddressFree(va, 2 * MiB) == CUDA_SUCCESS, "free the reservation");
    printf("%s ok\n", check_name);
}

/* A cuMemCreate of 4 MiB, its answer printed as "<key> <bytes> <rc>" and
 * the handle released when made. */
static void create_4mib(const char *key, const CUmemAllocationProp *prop)
{
    CUmemGenericAllocationHandle more;
    CUresult rc = cuMemCreate(&more, 4 * MiB, prop, 0);
    printf("%s %zu %d\n", key, 4 * MiB, rc);
    if (rc == CUDA_SUCCESS)
        printf("release %d\n", cuMemRelease(more));
}

static void check_vmmadjacent(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h1, h2;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CHECK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemCreate(&h1, 2 * MiB, &prop, 0) == CUDA_SUCCESS &&
          cuMemCreate(&h2, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create two");
    CHECK(cuMemMap(va, 2 * MiB, 0, h1, 0) == CUDA_SUCCESS &&
          cuMemMap(va + 2 * MiB, 2 * MiB, 0, h2, 0) == CUDA_SUCCESS, "map side by side");
    printf("release both: %d %d\n", cuMemRelease(h1), cuMemRelease(h2));
    /* The range ends where the second mapping begins. */
    printf("unmap the first: %d\n", cuMemUnmap(va, 2 * MiB));
    create_4mib("vmmadjacent", &prop);
    printf("unmap the second: %d\n", cuMemUnmap(va + 2 * MiB, 2 * MiB));
    create_4mib("vmmadjacent", &prop);
    CHECK(cuMemAddressFree(va, 4 * MiB) == CUDA_SUCCESS, "free the reservation");
    printf("%s ok\n", check_name);
}

static void check_vmmretainlate(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h, again = 0;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "set context");
    CHECK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemCreate(&h, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    CHECK(cuMemMap(va, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "map");
    printf("release while mapped: %d\n", cuMemRelease(h));
    CUresult rc = cuMemRetainAllocationHandle(&again, (void *)(uintptr_t)va);
    printf("retain: %d, the same handle: %d\n", rc, again == h);
    printf("unmap: %d\n", cuMemUnmap(va, 2 * MiB));
    /* Unmapped, but the retained reference holds the 2 MiB. */
    create_4mib("vmmretainlate", &prop);
    printf("release the retained: %d\n", cuMemRelease(again));
    create_4mib("vmmretainlate", &prop);
    CHECK(cuMemAddressFree(va, 2 * MiB) == CUDA_SUCCESS, "free the reservation");
    printf("%s ok\n", check_name);
}

static void check_poolpeer(void)
{
    CUdeviceptr served, p;
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS && cuMemAlloc_v2(&served, MiB) == CUDA_SUCCESS,
          "1 MiB on device 0");
    CUmemoryPool made;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CHECK(cuMemPoolCreate(&made, &props) == CUDA_SUCCESS, "a pool of device 1");
    CUmemAccessDesc peer = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                            .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    printf("access given: %d\n", cuMemPoolSetAccess(made, &peer, 1));
    CUmemAccess_flags flags = 0;
    CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0};
    CUresult asked = cuMemPoolGetAccess(&flags, made, &loc);
    printf("access of device 0: %d, flags %d\n", asked, (int)flags);
    CUresult rc = cuMemAllocFromPoolAsync(&p, 4 * MiB, made, NULL);
    printf("poolpeer 4194304 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("free %d\n", cuMemFreeAsync(p, NULL));
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS && cuMemPoolDestroy(made) == CUDA_SUCCESS,
          "destroy the pool");
    CHECK(cuMemFree_v2(served) == CUDA_SUCCESS, "free device 0's");
    printf("%s ok\n", check_name);
}

static void check_poolother(void)
{
    CUmemoryPool pool1;
    CUdeviceptr served, p, q;
    CUstream s1;
    CHECK(cuDeviceGetDefaultMemPool(&pool1, 1) == CUDA_SUCCESS, "device 1's pool");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemAlloc_v2(&served, MiB) == CUDA_SUCCESS,
          "1 MiB on device 1");
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "a stream of device 1");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0's context current");
    CUresult rc = cuMemAllocFromPoolAsync(&p, 4 * MiB, pool1, NULL);
    printf("other 4194304 %d\n", rc);
    if (rc == CUDA_SUCCESS) {
        CUdeviceptr base;
        size_t size;
        printf("range %d\n", cuMemGetAddressRange_v2(&base, &size, p));
        printf("free %d\n", cuMemFreeAsync(p, NULL));
    }
    rc = cuMemAllocAsync(&q, 4 * MiB, s1);
    printf("stream 4194304 %d\n", rc);
    /* The calling thread's context stack as the program left it. */
    int depth = 0;
    for (CUcontext top = NULL; depth < 8 && cuCtxPopCurrent_v2(&top) == CUDA_SUCCESS && top;)
        depth++;
    printf("contexts on the stack after it: %d\n", depth);
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0's context current again");
    if (rc == CUDA_SUCCESS)
        printf("free %d\n", cuMemFreeAsync(q, s1));
    rc = cuMemAllocFromPoolAsync(&p, MiB, pool1, NULL);
    printf("other 1048576 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("free %d\n", cuMemFreeAsync(p, NULL));
    /* A pool the program made on device 1. */
    CUmemoryPool made;
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CHECK(cuMemPoolCreate(&made, &props) == CUDA_SUCCESS, "a pool of device 1");
    rc = cuMemAllocFromPoolAsync(&p, 4 * MiB, made, NULL);
    printf("made 4194304 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("free %d\n", cuMemFreeAsync(p, NULL));
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS && cuMemPoolDestroy(made) == CUDA_SUCCESS,
          "destroy the pool");
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "synchronize");
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuStreamSynchronize(s1) == CUDA_SUCCESS &&
          cuStreamDestroy_v2(s1) == CUDA_SUCCESS && cuMemFree_v2(served) == CUDA_SUCCESS,
          "free on device 1");
    printf("%s ok\n", check_name);
}

static void check_vmmother(void)
{
    CUmemAllocationProp prop = vmm_prop(1);
    CUdeviceptr served;
    CUmemGenericAllocationHandle h;
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemAlloc_v2(&served, MiB) == CUDA_SUCCESS,
          "1 MiB on device 1");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0's context current");
    CUresult rc = cuMemCreate(&h, 4 * MiB, &prop, 0);
    printf("vmmother 4194304 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("release %d\n", cuMemRelease(h));
    rc = cuMemCreate(&h, 2 * MiB, &prop, 0);
    printf("vmmother 2097152 %d\n", rc);
    if (rc == CUDA_SUCCESS)
        printf("release %d\n", cuMemRelease(h));
    CHECK(cuMemFree_v2(served) == CUDA_SUCCESS, "free on device 1");
    printf("%s ok\n", check_name);
}

static void check_queries(void)
{
    CUmemoryPool pool1;
    CUmemAccess_flags flags = 99;
    CUstream s;
    CUcontext c = NULL;
    CHECK(cuDeviceGetDefaultMemPool(&pool1, 1) == CUDA_SUCCESS, "device 1's pool");
    for (int dev = 0; dev < 3; dev++) {
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
        flags = 99;
        CUresult rc = cuMemPoolGetAccess(&flags, pool1, &loc);
        printf("access of device %d to device 1's pool: %d, flags %u\n", dev, rc,
               rc == CUDA_SUCCESS ? flags : 99);
    }
    CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuStreamCreate(&s, 0) == CUDA_SUCCESS,
          "a stream of device 1");
    CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS, "device 0's context");
    CUresult rc = cuStreamGetCtx(s, &c);
    printf("the stream's context: %d, device 1's: %d\n", rc, c == ctx[1]);
    rc = cuStreamGetCtx(NULL, &c);
    printf("the default stream's context: %d, the current one: %d\n", rc, c == ctx[0]);
    CHECK(cuStreamDestroy_v2(s) == CUDA_SUCCESS, "destroy the stream");
    CUmemGenericAllocationHandle h;
    rc = cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)4096);
    printf("retain at an unmapped address: %d\n", rc);
    printf("%s ok\n", check_name);
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
        {"unserved", check_unserved},       {"poolinold", check_poolinold},
        {"destroyprim", check_destroyprim}, {"releaseextra", check_releaseextra},
        {"vmmtwice", check_vmmtwice},       {"vmmpartial", check_vmmpartial},
        {"poolother", check_poolother},     {"vmmother", check_vmmother},
        {"vmmretain", check_vmmretain},     {"popped", check_popped},
        {"queries", check_queries},         {"elsewhere", check_elsewhere},
        {"vmmadjacent", check_vmmadjacent}, {"vmmretainlate", check_vmmretainlate},
        {"poolpeer", check_poolpeer},
    };
    return run_checks(argc, argv, checks, sizeof checks / sizeof checks[0]);
}
