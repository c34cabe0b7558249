/* Checks of stream-ordered allocation (cuMemAllocAsync & co., family
 * cuda-async) and of stream capture under the shim, against the stand-in
 * driver (tests/cudadrv), run under LD_PRELOAD=libspyreshim.so by
 * tests/integration/test_cuda_async.py. One check per argument; each
 * prints "<check> ok" or "<check> FAIL: why"; the exit status is the
 * number of failures. Linked with -lcuda.
 *
 *   limit    under SPYRESHIM_LIMIT=4M: 3 MiB async on one stream, 2 MiB
 *            more succeeds once the pressure callback frees the first
 *            (cuMemFreeAsync); 3 MiB more fails with out-of-memory after a
 *            callback run that frees nothing; cuMemAllocFromPoolAsync too
 *   leak     1 MiB by cuMemAllocAsync and 64 KiB by cuMemAllocFromPoolAsync,
 *            never freed (from leak_async_here)
 *   trim     async allocations freed, then cuMemPoolTrimTo(pool, 0): prints
 *            "trimmed <bytes>" (what the pool gave back)
 *   streams  a free on stream 1 still pending is not reused by stream 2
 *            (needs CUDASTANDIN_OP_DELAY_US), the freeing stream reuses it
 *            at once, stream 2 after the free's event
 *   capture  a global capture on this thread: served requests from what
 *            the shim has, 900 where a region is needed, async allocation
 *            legal, over the limit out-of-memory without a callback, pinned
 *            and managed memory the driver's 900, no synchronizing call
 *            (cudastandinSyncsDuringCapture) and no callback meanwhile;
 *            after it everything works again
 *   relaxed  the same capture with this thread relaxed (PyTorch's mode
 *            while it allocates): a region is out-of-memory, no callback
 * Prints "callbacks <n>" after the checks that count them. */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks.h"
#include "cudadrv.h"

typedef struct spyreshim_lock spyreshim_lock;
typedef void (*pressure_fn)(spyreshim_lock *lock, size_t want, void *user);

static CUcontext ctx0;

enum { RELEASE_THRESHOLD = 4, RESERVED_CURRENT = 5 };

/* The pressure callback: counts its runs and frees the garbage it is
 * given (one stream-ordered allocation), as a collection would. */
static int callback_runs;
static CUdeviceptr garbage;
static CUstream garbage_stream;

static void on_pressure(spyreshim_lock *lock, size_t want, void *user)
{
    (void)lock, (void)want, (void)user;
    callback_runs++;
    if (garbage) {
        cuMemFreeAsync(garbage, garbage_stream);
        garbage = 0;
    }
}

/* The stand-in's witness (tests/cudadrv/capture.c), looked up: a toolkit's
 * stub libcuda may be what the program was linked against. */
static unsigned long long syncs_during_capture(void)
{
    unsigned long long (*fn)(void);
    *(void **)&fn = dlsym(RTLD_DEFAULT, "cudastandinSyncsDuringCapture");
    return fn ? fn() : ~0ull;
}

static int register_callback(void)
{
    int (*reg)(pressure_fn, void *);
    *(void **)&reg = dlsym(RTLD_DEFAULT, "spyreshim_register_pressure_callback");
    return reg ? reg(on_pressure, NULL) : -1;
}

__attribute__((noinline)) static void check_limit(void)
{
    CHECK(register_callback() == 0, "the shim's pressure API (preloaded?)");
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    CUdeviceptr a, b, c;
    CHECK(cuMemAllocAsync(&a, 3 << 20, s) == CUDA_SUCCESS, "3 MiB");
    garbage = a;
    garbage_stream = s;
    CUresult rc = cuMemAllocAsync(&b, 2 << 20, s);
    CHECK(rc == CUDA_SUCCESS, "2 MiB more after the callback freed 3: %d", rc);
    CHECK(callback_runs >= 1 && garbage == 0, "the callback ran and freed (%d)", callback_runs);
    int before = callback_runs;
    CUmemoryPool pool;
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS, "default pool");
    rc = cuMemAllocFromPoolAsync(&c, 3 << 20, pool, s);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "3 MiB from the pool over the limit: %d", rc);
    CHECK(callback_runs > before, "no callback before the out-of-memory");
    CHECK(cuMemFreeAsync(b, s) == CUDA_SUCCESS, "free");
    CHECK(cuMemAllocFromPoolAsync(&c, 3 << 20, pool, s) == CUDA_SUCCESS, "3 MiB after the free");
    CHECK(cuMemFreeAsync(c, s) == CUDA_SUCCESS, "free");
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS, "sync");
    printf("callbacks %d\n", callback_runs);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void leak_async_here(CUstream s)
{
    CUdeviceptr a, b;
    CUmemoryPool pool;
    CHECK(cuMemAllocAsync(&a, 1 << 20, s) == CUDA_SUCCESS, "1 MiB");
    CHECK(cuDeviceGetMemPool(&pool, 0) == CUDA_SUCCESS, "pool");
    CHECK(cuMemAllocFromPoolAsync(&b, 64 << 10, pool, s) == CUDA_SUCCESS, "64 KiB");
}

__attribute__((noinline)) static void check_leak(void)
{
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    int before = failures;
    leak_async_here(s);
    CHECK(failures == before, "leaked");
    CUdeviceptr freed;
    CHECK(cuMemAllocAsync(&freed, 4096, s) == CUDA_SUCCESS, "4 KiB");
    CHECK(cuMemFreeAsync(freed, s) == CUDA_SUCCESS, "freed: not a leak");
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_trim(void)
{
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    CUmemoryPool pool;
    CHECK(cuDeviceGetMemPool(&pool, 0) == CUDA_SUCCESS, "pool");
    cuuint64_t keep = UINT64_MAX; /* synchronizations keep it: only the trim gives back */
    CHECK(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &keep) == CUDA_SUCCESS, "threshold");
    CUdeviceptr a, b;
    CHECK(cuMemAllocAsync(&a, 1 << 20, s) == CUDA_SUCCESS, "1 MiB");
    CHECK(cuMemAllocAsync(&b, 256 << 10, s) == CUDA_SUCCESS, "256 KiB");
    CHECK(cuMemFreeAsync(a, s) == CUDA_SUCCESS && cuMemFreeAsync(b, s) == CUDA_SUCCESS, "frees");
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS, "sync");
    cuuint64_t before = 0, after = 1;
    CHECK(cuMemPoolGetAttribute(pool, RESERVED_CURRENT, &before) == CUDA_SUCCESS, "reserved");
    CHECK(before == (1 << 20) + (256 << 10), "the pool keeps what was freed: %llu", before);
    CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS, "trim");
    CHECK(cuMemPoolGetAttribute(pool, RESERVED_CURRENT, &after) == CUDA_SUCCESS && after == 0,
          "trimmed to nothing: %llu", after);
    printf("trimmed %llu\n", before - after);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_streams(void)
{
    CUstream s1, s2;
    CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
          cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "streams");
    CUmemoryPool pool;
    CHECK(cuDeviceGetMemPool(&pool, 0) == CUDA_SUCCESS, "pool");
    cuuint64_t keep = UINT64_MAX;
    CHECK(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &keep) == CUDA_SUCCESS, "threshold");
    CUdeviceptr a, b, c, d;
    CHECK(cuMemAllocAsync(&a, 1 << 20, s1) == CUDA_SUCCESS, "a");
    CHECK(cuMemsetD8Async(a, 7, 1 << 20, s1) == CUDA_SUCCESS, "slow work on s1");
    CHECK(cuMemFreeAsync(a, s1) == CUDA_SUCCESS, "free a on s1");
    CHECK(cuMemAllocAsync(&b, 1 << 20, s2) == CUDA_SUCCESS, "b");
    CHECK(b != a, "stream 2 got a block whose free on stream 1 is pending");
    CHECK(cuMemAllocAsync(&c, 1 << 20, s1) == CUDA_SUCCESS, "c");
    CHECK(c == a, "stream 1 reuses its own free at once");
    CHECK(cuMemFreeAsync(c, s1) == CUDA_SUCCESS, "free c on s1");
    CUevent ev;
    CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "event");
    CHECK(cuEventRecord(ev, s1) == CUDA_SUCCESS, "record after the free");
    CHECK(cuEventSynchronize(ev) == CUDA_SUCCESS, "the free's event");
    CHECK(cuMemAllocAsync(&d, 1 << 20, s2) == CUDA_SUCCESS, "d");
    CHECK(d == a, "stream 2 reuses it after the free's event");
    CHECK(cuMemFreeAsync(d, s2) == CUDA_SUCCESS && cuMemFreeAsync(b, s2) == CUDA_SUCCESS,
          "frees");
    CHECK(cuStreamSynchronize(s2) == CUDA_SUCCESS, "sync");
    printf("%s ok\n", check_name);
}

/* The capture checks, `relaxed`: this thread in relaxed mode. */
static void capture_checks(bool relaxed)
{
    CHECK(register_callback() == 0, "the shim's pressure API (preloaded?)");
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS, "stream");
    /* Before: a served block, so that the shim has a region to serve from. */
    CUdeviceptr first, served, big, async1, async2, managed;
    CHECK(cuMemAlloc_v2(&first, 64 << 10) == CUDA_SUCCESS, "a served block");
    CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS, "begin");
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (relaxed)
        CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS, "relaxed");
    CHECK(cuMemAlloc_v2(&served, 64 << 10) == CUDA_SUCCESS, "served from the region it has");
    CUresult rc = cuMemAlloc_v2(&big, 3 << 20);
    CUresult want = relaxed ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CHECK(rc == want, "a request that needs a region: %d, not %d", rc, want);
    CHECK(cuMemFree_v2(served) == CUDA_SUCCESS, "a served free, without a wait");
    CHECK(cuMemAllocAsync(&async1, 1 << 20, s) == CUDA_SUCCESS, "async during the capture");
    rc = cuMemAllocAsync(&async2, 3 << 20, s);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "async over the limit during the capture: %d", rc);
    CHECK(callback_runs == 0, "a callback ran during the capture (%d)", callback_runs);
    CHECK(cuMemFreeAsync(async1, s) == CUDA_SUCCESS, "async free during the capture");
    CHECK(syncs_during_capture() == 0, "the shim synchronized during the capture (%llu)",
          syncs_during_capture());
    if (!relaxed) {
        void *h;
        rc = cuMemHostAlloc(&h, 4096, 0);
        CHECK(rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "pinned during the capture: %d", rc);
        rc = cuMemAllocManaged(&managed, 4096, CU_MEM_ATTACH_GLOBAL);
        CHECK(rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "managed during the capture: %d", rc);
    }
    if (relaxed)
        CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS, "back to global");
    CUgraph g;
    rc = cuStreamEndCapture(s, &g);
    CHECK(rc == (relaxed ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), "end: %d", rc);
    CHECK(syncs_during_capture() == 0, "the shim synchronized during the capture");
    /* After it, regions and waits again. */
    CHECK(cuMemAlloc_v2(&big, 3 << 20) == CUDA_SUCCESS, "a region after the capture");
    CHECK(cuMemFree_v2(big) == CUDA_SUCCESS && cuMemFree_v2(first) == CUDA_SUCCESS, "frees");
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "sync");
    printf("callbacks %d\n", callback_runs);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_capture(void)
{
    capture_checks(false);
}

__attribute__((noinline)) static void check_relaxed(void)
{
    capture_checks(true);
}

int main(int argc, char **argv)
{
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx0, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx0) != CUDA_SUCCESS) {
        printf("no device\n");
        return 100;
    }
    static const struct named_check checks[] = {
        {"limit", check_limit},     {"leak", check_leak},       {"trim", check_trim},
        {"streams", check_streams}, {"capture", check_capture}, {"relaxed", check_relaxed},
    };
    return run_checks(argc, argv, checks, sizeof checks / sizeof checks[0]);
}
