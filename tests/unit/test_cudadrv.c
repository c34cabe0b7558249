/* The CUDA driver stand-in (tests/cudadrv) through its exported API, as a
 * program linked with -lcuda sees it. Run with CUDASTANDIN_DEVICES=2 and
 * CUDASTANDIN_MEMORY=64M,32M (tests/meson.build). Criterion runs every test
 * in its own process, so tests that need a per-operation delay set
 * CUDASTANDIN_OP_DELAY_US before their cuInit. Nothing here is timed: a
 * delay only makes queued work observably pending. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"

#define OK(call) cr_assert_eq((call), CUDA_SUCCESS, "%s", #call)

/* Long enough that nothing queued can have run by the next statement. */
#define SLOW_US "300000"

static CUcontext primary(CUdevice dev)
{
    CUcontext c;
    OK(cuDevicePrimaryCtxRetain(&c, dev));
    OK(cuCtxSetCurrent(c));
    return c;
}

static void init_with_delay(const char *us)
{
    setenv("CUDASTANDIN_OP_DELAY_US", us, 1);
    OK(cuInit(0));
}

Test(cudadrv, calls_before_init_are_not_initialized)
{
    CUdeviceptr p;
    CUcontext c;
    int n;
    cr_assert_eq(cuMemAlloc_v2(&p, 1024), CUDA_ERROR_NOT_INITIALIZED);
    cr_assert_eq(cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    cr_assert_eq(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    OK(cuDriverGetVersion(&n));
    cr_assert_eq(n, 13000);
}

Test(cudadrv, two_devices_have_distinct_ranges_and_capacities)
{
    OK(cuInit(0));
    int n;
    OK(cuDeviceGetCount(&n));
    cr_assert_eq(n, 2);
    CUdeviceptr p[2];
    size_t total[2], free_b;
    for (int d = 0; d < 2; d++) {
        primary(d);
        OK(cuMemAlloc_v2(&p[d], 4096));
        cr_assert_eq(p[d] % 512, 0, "512-byte aligned");
        OK(cuMemGetInfo_v2(&free_b, &total[d]));
        cr_assert_eq(free_b, total[d] - 4096);
        int ord = -1;
        OK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p[d]));
        cr_assert_eq(ord, d);
    }
    cr_assert_eq(total[0], 64u << 20);
    cr_assert_eq(total[1], 32u << 20);
    /* Neither range contains the other's block. */
    cr_assert(p[1] >= p[0] + (64u << 20) || p[0] >= p[1] + (32u << 20));
}

Test(cudadrv, pointer_of_another_device_is_refused)
{
    OK(cuInit(0));
    primary(0);
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 4096));
    char buf[16] = { 0 };
    OK(cuMemcpyHtoD_v2(p, buf, sizeof buf));
    primary(1);
    cr_assert_eq(cuMemsetD8_v2(p, 1, 16), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemcpyHtoD_v2(p, buf, sizeof buf), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemcpyDtoH_v2(buf, p, sizeof buf), CUDA_ERROR_INVALID_VALUE);
    /* Not an allocation at all: the same error. */
    cr_assert_eq(cuMemsetD8_v2(0x1000, 1, 16), CUDA_ERROR_INVALID_VALUE);
    /* Past the end of a live block. */
    primary(0);
    cr_assert_eq(cuMemsetD8_v2(p, 1, 4097), CUDA_ERROR_INVALID_VALUE);
}

Test(cudadrv, out_of_memory_is_2_and_frees_give_it_back)
{
    OK(cuInit(0));
    primary(1);                     /* 32M */
    CUdeviceptr big;
    cr_assert_eq(cuMemAlloc_v2(&big, 33u << 20), CUDA_ERROR_OUT_OF_MEMORY);
    CUdeviceptr p[8];
    for (int i = 0; i < 4; i++)
        OK(cuMemAlloc_v2(&p[i], 8u << 20));
    cr_assert_eq(cuMemAlloc_v2(&big, 1), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemFree_v2(p[2]));
    OK(cuMemAlloc_v2(&big, 8u << 20));
    cr_assert_eq(big, p[2], "first fit reuses the hole");
    cr_assert_eq(cuMemAlloc_v2(&big, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemFree_v2(p[0] + 512), CUDA_ERROR_INVALID_VALUE, "interior pointer");
}

Test(cudadrv, alloc_pitch_rounds_rows_and_checks_element_size)
{
    OK(cuInit(0));
    primary(0);
    CUdeviceptr p, base;
    size_t pitch, size;
    cr_assert_eq(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 2), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemAllocPitch_v2(&p, &pitch, 0, 10, 4), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemAllocPitch_v2(&p, &pitch, 100, 10, 4));
    cr_assert_eq(pitch, 512);
    OK(cuMemGetAddressRange_v2(&base, &size, p));
    cr_assert_eq(size, 512 * 10);
    OK(cuMemAllocPitch_v2(&p, &pitch, 513, 3, 16));
    cr_assert_eq(pitch, 1024);
}

Test(cudadrv, address_range_names_the_whole_allocation)
{
    OK(cuInit(0));
    CUcontext c = primary(0);
    CUdeviceptr p, base;
    size_t size;
    OK(cuMemAlloc_v2(&p, 10000));
    OK(cuMemGetAddressRange_v2(&base, &size, p + 777));
    cr_assert_eq(base, p);
    cr_assert_eq(size, 10000);
    cr_assert_eq(cuMemGetAddressRange_v2(&base, &size, p + 10000), CUDA_ERROR_NOT_FOUND);
    CUcontext owner;
    OK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p + 5));
    cr_assert_eq(owner, c);
    OK(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 5));
    cr_assert_eq(base, p);
}

/* Across processes: tests/integration/test_cuda_ipc.py. Here what one
 * process sees: a handle of any address inside an allocation, refused in
 * the process that made it, bad flags and handles refused. */
Test(cudadrv, ipc_handles_in_the_exporting_process)
{
    OK(cuInit(0));
    primary(0);
    CUdeviceptr p, opened;
    OK(cuMemAlloc_v2(&p, 10000));
    CUipcMemHandle h, h2;
    OK(cuIpcGetMemHandle(&h, p + 5));
    OK(cuIpcGetMemHandle(&h2, p));
    cr_assert(memcmp(&h, &h2, sizeof h) == 0, "a handle names the allocation, not the address");
    cr_assert_eq(cuIpcOpenMemHandle_v2(&opened, h, 1), CUDA_ERROR_INVALID_CONTEXT,
                 "the driver refuses a handle in the process that made it");
    cr_assert_eq(cuIpcOpenMemHandle_v2(&opened, h, 2), CUDA_ERROR_INVALID_VALUE);
    CUipcMemHandle junk;
    memset(&junk, 0x5a, sizeof junk);
    cr_assert_eq(cuIpcOpenMemHandle_v2(&opened, junk, 0), CUDA_ERROR_INVALID_HANDLE);
    cr_assert_eq(cuIpcGetMemHandle(&h, p + 10000), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE, "not an opened handle");
    OK(cuMemFree_v2(p));
    cr_assert_eq(cuIpcGetMemHandle(&h, p), CUDA_ERROR_INVALID_VALUE);
}

Test(cudadrv, context_stack_pushes_and_pops)
{
    OK(cuInit(0));
    CUdevice dev;
    CUcontext cur, popped, created, prim;
    cr_assert_eq(cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(cuCtxPopCurrent_v2(&popped), CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr p;
    cr_assert_eq(cuMemAlloc_v2(&p, 512), CUDA_ERROR_INVALID_CONTEXT);

    OK(cuCtxCreate_v2(&created, 0, 1));
    OK(cuCtxGetCurrent(&cur));
    cr_assert_eq(cur, created);
    OK(cuDevicePrimaryCtxRetain(&prim, 0));
    OK(cuCtxPushCurrent_v2(prim));
    OK(cuCtxGetDevice(&dev));
    cr_assert_eq(dev, 0);
    OK(cuCtxPopCurrent_v2(&popped));
    cr_assert_eq(popped, prim);
    OK(cuCtxGetDevice(&dev));
    cr_assert_eq(dev, 1);
    /* The CUDA 13 form with a context, and with garbage (numba's 1-arg use). */
    OK(cuCtxGetDevice_v2(&dev, prim));
    cr_assert_eq(dev, 0);
    OK(cuCtxGetDevice_v2(&dev, (CUcontext)0x1234));
    cr_assert_eq(dev, 1);

    OK(cuMemAlloc_v2(&p, 512));
    OK(cuCtxDestroy_v2(created));
    OK(cuCtxGetCurrent(&cur));
    cr_assert_null(cur, "destroying the current context pops it");
    cr_assert_eq(cuCtxPushCurrent_v2(created), CUDA_ERROR_INVALID_CONTEXT);
    size_t size;
    CUdeviceptr base;
    OK(cuCtxPushCurrent_v2(prim));
    cr_assert_eq(cuMemGetAddressRange_v2(&base, &size, p), CUDA_ERROR_NOT_FOUND,
                 "a destroyed context's memory is gone");

    unsigned flags;
    int active;
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    cr_assert_eq(active, 1);
    OK(cuDevicePrimaryCtxRelease_v2(0));
    OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    cr_assert_eq(active, 0);
    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
}

Test(cudadrv, stream_work_runs_later_and_in_order)
{
    init_with_delay(SLOW_US);
    primary(0);
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 256));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char host[256];
    memset(host, 0x11, sizeof host);
    OK(cuMemsetD8Async(p, 0xAB, 256, s));
    cr_assert_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    OK(cuStreamSynchronize(s));
    OK(cuStreamQuery(s));
    OK(cuMemcpyDtoH_v2(host, p, sizeof host));
    for (size_t i = 0; i < sizeof host; i++)
        cr_assert_eq(host[i], 0xAB);

    /* In order: the last operation decides. */
    OK(cuMemsetD32Async(p, 0x01020304, 64, s));
    OK(cuMemsetD8Async(p, 0x77, 1, s));
    OK(cuMemcpyDtoHAsync_v2(host, p, 8, s));
    OK(cuStreamSynchronize(s));
    unsigned char want[8] = { 0x77, 0x03, 0x02, 0x01, 0x04, 0x03, 0x02, 0x01 };
    cr_assert_arr_eq(host, want, 8);
    OK(cuStreamDestroy_v2(s));
    cr_assert_eq(cuStreamQuery(s), CUDA_ERROR_INVALID_HANDLE);
}

Test(cudadrv, legacy_stream_waits_for_blocking_streams)
{
    init_with_delay(SLOW_US);
    primary(0);
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 64));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    OK(cuMemsetD8Async(p, 0x42, 64, s));
    /* A synchronous copy is a legacy-stream operation: it runs after the
     * blocking stream's memset without anyone synchronizing that stream. */
    unsigned char host[64];
    OK(cuMemcpyDtoH_v2(host, p, sizeof host));
    for (size_t i = 0; i < sizeof host; i++)
        cr_assert_eq(host[i], 0x42);
    OK(cuStreamQuery(s));
}

Test(cudadrv, events_order_streams_and_time_them)
{
    init_with_delay("1000");
    primary(0);
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 64));
    CUstream a, b;
    OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    CUevent start, done;
    OK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    OK(cuEventCreate(&done, CU_EVENT_DEFAULT));
    OK(cuEventRecord(start, a));
    OK(cuMemsetD8Async(p, 0x33, 64, a));
    OK(cuEventRecord(done, a));
    OK(cuStreamWaitEvent(b, done, 0));
    unsigned char host[64] = { 0 };
    OK(cuMemcpyDtoHAsync_v2(host, p, sizeof host, b));
    OK(cuStreamSynchronize(b));
    for (size_t i = 0; i < sizeof host; i++)
        cr_assert_eq(host[i], 0x33);
    OK(cuEventSynchronize(done));
    OK(cuEventQuery(done));
    float ms = -1;
    OK(cuEventElapsedTime_v2(&ms, start, done));
    cr_assert_geq(ms, 0.0f);
    OK(cuEventDestroy_v2(start));
    OK(cuEventDestroy_v2(done));
}

Test(cudadrv, mem_free_waits_for_queued_work)
{
    init_with_delay(SLOW_US);
    primary(0);
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 128));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned char host[128] = { 0 };
    OK(cuMemsetD8Async(p, 0x5A, 128, s));
    OK(cuMemcpyDtoHAsync_v2(host, p, sizeof host, s));
    OK(cuMemFree_v2(p));
    /* No synchronization: the free itself waited for the device. */
    OK(cuStreamQuery(s));
    for (size_t i = 0; i < sizeof host; i++)
        cr_assert_eq(host[i], 0x5A);
}

Test(cudadrv, get_proc_address_answers_by_version_and_flags)
{
    void *fn;
    CUdriverProcAddressQueryResult st;
    /* Before cuInit, as the runtime uses it. */
    OK(cuGetProcAddress_v2("cuGetProcAddress", &fn, 12000, 0, &st));
    cr_assert_eq(fn, (void *)cuGetProcAddress_v2);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SUCCESS);
    OK(cuGetProcAddress_v2("cuGetProcAddress", &fn, 11030, 0, &st));
    cr_assert_eq(fn, (void *)cuGetProcAddress);
    cr_assert_eq(cuGetProcAddress_v2("cuGetProcAddress", &fn, 11020, 0, &st),
                 CUDA_ERROR_NOT_FOUND);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    cr_assert_null(fn);

    OK(cuGetProcAddress("cuMemAlloc", &fn, 3020, 0));
    cr_assert_eq(fn, (void *)cuMemAlloc_v2);
    OK(cuGetProcAddress("cuMemAlloc", &fn, 13000, 0));
    cr_assert_eq(fn, (void *)cuMemAlloc_v2);
    OK(cuGetProcAddress("cuMemAlloc", &fn, 2000, 0));
    cr_assert_eq(fn, (void *)cuMemAlloc);
    OK(cuGetProcAddress("cuMemFree", &fn, 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM));
    cr_assert_eq(fn, (void *)cuMemFree_v2);
    OK(cuGetProcAddress("cuMemcpyAsync", &fn, 4000, CU_GET_PROC_ADDRESS_LEGACY_STREAM));
    cr_assert_eq(fn, (void *)cuMemcpyAsync);
    OK(cuGetProcAddress("cuCtxGetDevice", &fn, 12000, 0));
    cr_assert_eq(fn, (void *)cuCtxGetDevice);
    OK(cuGetProcAddress("cuCtxGetDevice", &fn, 13000, 0));
    cr_assert_eq(fn, (void *)cuCtxGetDevice_v2);
    cr_assert_eq(cuGetProcAddress("cuMemAlloc", &fn, 3020, 4), CUDA_ERROR_INVALID_VALUE);

    fn = (void *)1;
    cr_assert_eq(cuGetProcAddress_v2("cuNoSuchFunction", &fn, 13000, 0, &st),
                 CUDA_ERROR_NOT_FOUND);
    cr_assert_null(fn);
    cr_assert_eq(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* Names are the unsuffixed ones. */
    cr_assert_eq(cuGetProcAddress_v2("cuMemAlloc_v2", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    /* An ABI version newer than the one implemented is refused, not
     * answered with an older signature. */
    cr_assert_eq(cuGetProcAddress_v2("cuCtxCreate", &fn, 11040, 0, &st), CUDA_ERROR_NOT_FOUND);
    cr_assert_eq(cuGetProcAddress_v2("cuCtxCreate", &fn, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
    OK(cuGetProcAddress_v2("cuCtxCreate", &fn, 12050, 0, &st));
    cr_assert_eq(fn, (void *)cuCtxCreate_v4);
}

Test(cudadrv, error_names_and_strings)
{
    const char *s;
    OK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s));
    cr_assert_str_eq(s, "CUDA_ERROR_OUT_OF_MEMORY");
    OK(cuGetErrorName(600, &s));
    cr_assert_str_eq(s, "CUDA_ERROR_NOT_READY");
    OK(cuGetErrorString(201, &s));
    cr_assert_str_eq(s, "invalid device context");
    cr_assert_eq(cuGetErrorName(12345, &s), CUDA_ERROR_INVALID_VALUE);
}

Test(cudadrv, host_access_to_device_memory_faults)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        CUcontext c;
        CUdeviceptr p;
        if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)
            || cuMemAlloc_v2(&p, 4096))
            _exit(2);
        *(volatile char *)(uintptr_t)p = 1;
        _exit(0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status), "the child exited with status %d", WEXITSTATUS(status));
    cr_assert_eq(WTERMSIG(status), SIGSEGV);
}

/* ---- what numba needs of the driver ---------------------------------- */

Test(cudadrv, visible_devices_renumber_and_stop_at_the_first_that_is_not_one)
{
    setenv("CUDA_VISIBLE_DEVICES", "1,7,0", 1);
    OK(cuInit(0));
    int n;
    OK(cuDeviceGetCount(&n));
    cr_assert_eq(n, 1, "device 7 does not exist: the list stops there");
    primary(0);
    size_t free_b, total;
    OK(cuMemGetInfo_v2(&free_b, &total));
    cr_assert_eq(total, 32u << 20, "ordinal 0 is the second device (32M)");
}

Test(cudadrv, no_visible_device_is_no_device)
{
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    cr_assert_eq(cuInit(0), CUDA_ERROR_NO_DEVICE);
}

static void note_callback(CUstream s, CUresult status, void *user)
{
    (void)s;
    *(int *)user = status == CUDA_SUCCESS ? 1 : 2;
}

Test(cudadrv, frees_with_no_context_host_memory_callbacks_and_the_profiler)
{
    OK(cuInit(0));
    primary(0);
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 4096));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    int called = 0;
    OK(cuStreamAddCallback(s, note_callback, &called, 0));
    OK(cuStreamSynchronize(s));
    cr_assert_eq(called, 1);
    /* Pinned host memory: the host writes it, the device copies from it. */
    void *h;
    OK(cuMemHostAlloc(&h, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
    memset(h, 0x7e, 4096);
    OK(cuMemcpyHtoD_v2(p, h, 4096));
    CUdeviceptr hd;
    OK(cuMemHostGetDevicePointer_v2(&hd, h, 0));
    OK(cuMemsetD8_v2(hd, 0x11, 16));
    cr_assert_eq(((unsigned char *)h)[15], 0x11);
    unsigned type = 0;
    OK(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h));
    cr_assert_eq(type, CU_MEMORYTYPE_HOST);
    OK(cuMemFreeHost(h));
    cr_assert_eq(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE, "freed twice");
    CUdeviceptr m;
    OK(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL));
    ((char *)(uintptr_t)m)[0] = 1; /* managed memory is the host's too */
    OK(cuProfilerStart());
    OK(cuProfilerStop());
    /* numba's cuda.close(): every context popped, then its pending frees. */
    CUcontext popped;
    OK(cuCtxPopCurrent_v2(&popped));
    cr_assert_eq(cuMemAlloc_v2(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
    OK(cuMemFree_v2(p));
    OK(cuMemFree_v2(m));
    OK(cuStreamDestroy_v2(s));
    cr_assert_eq(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE, "freed twice");
}

/* ---- stream capture (capture.c) ---------------------------------------- */

static void *end_capture_elsewhere(void *arg)
{
    CUgraph g;
    return (void *)(intptr_t)cuStreamEndCapture((CUstream)arg, &g);
}

Test(cudadrv, capture_states_and_the_legacy_stream)
{
    OK(cuInit(0));
    primary(0);
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_DEFAULT));
    CUstreamCaptureStatus st = 7;
    cuuint64_t id = 0;
    OK(cuStreamGetCaptureInfo(s, &st, &id));
    cr_assert_eq(st, CU_STREAM_CAPTURE_STATUS_NONE);
    cr_assert_eq(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
                 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "the legacy stream is not captured");
    OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    cr_assert_eq(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
    OK(cuStreamGetCaptureInfo(s, &st, &id));
    cr_assert(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0);
    cr_assert_eq(cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, &id),
                 CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "a blocking stream captures");
    /* Begun in global mode: ended on its own thread only. */
    pthread_t t;
    void *rc;
    pthread_create(&t, NULL, end_capture_elsewhere, s);
    pthread_join(t, &rc);
    cr_assert_eq((intptr_t)rc, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    CUgraph g = NULL;
    OK(cuStreamEndCapture(s, &g));
    cr_assert_not_null(g);
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
    OK(cuStreamGetCaptureInfo(CU_STREAM_LEGACY, &st, &id));
}

Test(cudadrv, alloc_during_a_global_capture_is_refused_unless_relaxed)
{
    OK(cuInit(0));
    primary(0);
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    OK(cuThreadExchangeStreamCaptureMode(&m));
    cr_assert_eq(m, CU_STREAM_CAPTURE_MODE_GLOBAL, "the default mode");
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 4096));      /* relaxed: permitted */
    OK(cuMemFree_v2(p));
    OK(cuThreadExchangeStreamCaptureMode(&m));
    cr_assert_eq(m, CU_STREAM_CAPTURE_MODE_RELAXED);
    cr_assert_eq(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUstreamCaptureStatus st;
    OK(cuStreamIsCapturing(s, &st));
    cr_assert_eq(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CUgraph g = (CUgraph)1;
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_null(g);
    OK(cuMemAlloc_v2(&p, 4096));      /* the capture is over */
    OK(cuMemFree_v2(p));
    m = 9;
    cr_assert_eq(cuThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);
}

/* ---- stream-ordered pools (mempool.c) ----------------------------------- */

enum { RELEASE_THRESHOLD = 4, RESERVED_CURRENT = 5, RESERVED_HIGH = 6, USED_CURRENT = 7,
       USED_HIGH = 8, REUSE_OPPORTUNISTIC = 2 };

static cuuint64_t pool_attr(CUmemoryPool p, int attr)
{
    cuuint64_t v = 0;
    OK(cuMemPoolGetAttribute(p, attr, &v));
    return v;
}

Test(cudadrv, a_free_on_one_stream_is_reused_there_at_once_elsewhere_after_its_event)
{
    init_with_delay(SLOW_US);
    primary(0);
    CUstream s1, s2;
    OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    OK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CUmemoryPool pool;
    OK(cuDeviceGetMemPool(&pool, 0));
    cuuint64_t keep = UINT64_MAX; /* synchronizations keep the pool's memory */
    OK(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &keep));
    CUdeviceptr a, b, c;
    OK(cuMemAllocAsync(&a, 1 << 20, s1));
    OK(cuMemsetD8Async(a, 1, 1 << 20, s1)); /* slow: the free below stays pending */
    OK(cuMemFreeAsync(a, s1));
    OK(cuMemAllocAsync(&b, 1 << 20, s2));
    cr_assert_neq(b, a, "another stream does not reuse a free still pending");
    OK(cuMemAllocAsync(&c, 1 << 20, s1));
    cr_assert_eq(c, a, "the freeing stream reuses it at once");
    OK(cuMemFreeAsync(c, s1));
    CUevent ev;
    OK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    OK(cuEventRecord(ev, s1));
    OK(cuEventSynchronize(ev));
    CUdeviceptr d;
    OK(cuMemAllocAsync(&d, 1 << 20, s2));
    cr_assert_eq(d, a, "after the free's event, any stream");
    cr_assert_eq(cuMemFree_v2(d), CUDA_ERROR_INVALID_VALUE, "cuMemFree refuses pool memory");
    OK(cuMemFreeAsync(d, s2));
    OK(cuMemFreeAsync(b, s2));
    cr_assert_eq(cuMemFreeAsync(b, s2), CUDA_ERROR_INVALID_VALUE, "a double free");
}

Test(cudadrv, pool_threshold_trim_and_attributes)
{
    OK(cuInit(0));
    primary(0);
    CUmemoryPool pool, dflt;
    OK(cuDeviceGetDefaultMemPool(&dflt, 0));
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    OK(cuMemPoolCreate(&pool, &props));
    cr_assert_neq(pool, dflt);
    size_t free0, total;
    OK(cuMemGetInfo_v2(&free0, &total));
    CUdeviceptr p;
    OK(cuMemAllocFromPoolAsync(&p, 3000, pool, NULL));
    cr_assert_eq(pool_attr(pool, USED_CURRENT), 3072);
    cr_assert_eq(pool_attr(pool, RESERVED_CURRENT), 3072);
    size_t free1;
    OK(cuMemGetInfo_v2(&free1, &total));
    cr_assert_eq(free0 - free1, 3072, "the pool's memory is the device's");
    OK(cuMemFreeAsync(p, NULL));
    cr_assert_eq(pool_attr(pool, USED_CURRENT), 0);
    cuuint64_t keep = 1 << 20;
    OK(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &keep));
    OK(cuCtxSynchronize());
    cr_assert_eq(pool_attr(pool, RESERVED_CURRENT), 3072, "under the threshold: kept");
    OK(cuMemPoolTrimTo(pool, 0));
    cr_assert_eq(pool_attr(pool, RESERVED_CURRENT), 0, "trimmed");
    cr_assert_eq(pool_attr(pool, RESERVED_HIGH), 3072);
    cuuint64_t v = 5;
    cr_assert_eq(cuMemPoolSetAttribute(pool, USED_HIGH, &v), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemPoolSetAttribute(pool, USED_CURRENT, &v), CUDA_ERROR_INVALID_VALUE);
    v = 0;
    OK(cuMemPoolSetAttribute(pool, USED_HIGH, &v));
    cr_assert_eq(pool_attr(pool, USED_HIGH), 0);
    /* Threshold 0 (the default): a synchronization gives it all back. */
    OK(cuMemAllocFromPoolAsync(&p, 4096, pool, NULL));
    keep = 0;
    OK(cuMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &keep));
    OK(cuMemFreeAsync(p, NULL));
    OK(cuStreamSynchronize(NULL));
    cr_assert_eq(pool_attr(pool, RESERVED_CURRENT), 0);
    /* The device's current pool. */
    OK(cuDeviceSetMemPool(0, pool));
    CUmemoryPool cur;
    OK(cuDeviceGetMemPool(&cur, 0));
    cr_assert_eq(cur, pool);
    cr_assert_eq(cuDeviceSetMemPool(1, pool), CUDA_ERROR_INVALID_VALUE, "another device's pool");
    OK(cuMemAllocAsync(&p, 512, NULL));
    cr_assert_eq(pool_attr(pool, USED_CURRENT), 512);
    OK(cuMemPoolDestroy(pool));
    OK(cuDeviceGetMemPool(&cur, 0));
    cr_assert_eq(cur, dflt, "destroying the current pool restores the default");
    OK(cuMemFreeAsync(p, NULL)); /* still valid after the destroy */
    cr_assert_eq(cuMemPoolTrimTo(pool, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(cuMemPoolDestroy(dflt), CUDA_ERROR_INVALID_VALUE);
    props.handleTypes = 1;
    cr_assert_eq(cuMemPoolCreate(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
}

Test(cudadrv, async_alloc_is_legal_during_capture_and_outlives_its_context)
{
    OK(cuInit(0));
    CUcontext ctx;
    OK(cuCtxCreate_v2(&ctx, 0, 0));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    cr_assert_eq(cudastandinSyncsDuringCapture(), 0);
    OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUdeviceptr p, q;
    OK(cuMemAllocAsync(&p, 4096, s));
    void *h;
    cr_assert_eq(cuMemHostAlloc(&h, 4096, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cuMemFreeAsync(p, s));
    CUgraph g;
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    cr_assert_eq(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(cudastandinSyncsDuringCapture(), 1, "refused, and counted");
    CUevent ev;
    OK(cuEventCreate(&ev, 0));
    OK(cuEventSynchronize(ev));
    cr_assert_eq(cudastandinSyncsDuringCapture(), 2, "a wait during a capture is counted");
    cr_assert_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    OK(cuMemAllocAsync(&q, 4096, s));
    OK(cuStreamSynchronize(s));
    OK(cuStreamDestroy(s));
    OK(cuCtxDestroy_v2(ctx));
    primary(0);
    OK(cuMemFreeAsync(q, NULL)); /* a context's teardown leaves stream-ordered memory */
}
