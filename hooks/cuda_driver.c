/* The CUDA driver's allocation entry points (libcuda): where every CUDA
 * allocation is served, whatever route reached the driver
 * (docs/cuda.md):
 * - link time: the exported functions below, for programs and libraries
 *   linked with -lcuda;
 * - cuGetProcAddress(_v2): the wrappers of those two replace the pointers
 *   the real one hands out for a served name and ABI version, and for
 *   "cuGetProcAddress" itself (the CUDA runtime, static or shared, fetches
 *   it again at 11030 and 12000 and uses that pointer for every lookup);
 * - dlsym on a handle of the driver (numba, ctypes users): hooks/dlsym.c
 *   asks driver_lookup, which this file registers when the shim is
 *   loaded.
 *
 * Served: cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, cuMemAllocPitch_v2,
 * cuMemFreeAsync of a served block; cuMemGetAddressRange_v2 and
 * cuPointerGetAttribute(s) answer for the shim's addresses,
 * cuIpcGetMemHandle exports a block alone in its region and refuses one
 * that shares it. Passed through and recorded
 * (shim/alloc/passthrough.c): managed memory (cuMemAllocManaged, freed by
 * cuMemFree_v2) and host-pinned memory (cuMemHostAlloc, cuMemAllocHost(_v2),
 * cuMemHostRegister(_v2), cuMemFreeHost, cuMemHostUnregister), VMM
 * physical memory (cuMemCreate, cuMemRelease, cuMemRetainAllocationHandle,
 * with cuMemMap/cuMemUnmap's ranges) and stream-ordered memory (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync and _ptsz, freed by cuMemFreeAsync;
 * cuMemPoolTrimTo traced). Watched: stream captures
 * (cuStreamBeginCapture(_v2)(_ptsz), cuStreamEndCapture(_ptsz):
 * hooks/cuda_capture.c), the contexts made or retained (cuCtxCreate in
 * every form, cuDevicePrimaryCtxRetain: hooks/cuda_contexts.c), and the
 * context teardowns (cuCtxDestroy, cuDevicePrimaryCtxReset, the last
 * cuDevicePrimaryCtxRelease), which make the shim forget the context's
 * regions once the driver freed them. Everything else goes to the
 * driver untouched. Which context is current is the key of the regions
 * (shim/alloc/device.c keeps a device per context).
 *
 * Owns: the real driver functions (a runtime table, runtime_table.h:
 * learnt once, published with one compare-and-swap; no lock: resolving
 * calls the loader, whose lock a library constructor that allocates may
 * hold while it waits for us); the primary contexts' handles (atomics).
 * Never
 * dereferences a device address. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "hooks.h"
#include "loader.h"
#include "log.h"
#include "passthrough.h"
#include "pressure.h"
#include "runtime_table.h"

/* cuMemAllocPitch's pitch: the driver rounds the width up to its pitch
 * alignment, 512 bytes on every GPU since Fermi
 * (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT is 32, the larger of the
 * two is what cudaMallocPitch returns). */
#define PITCH_ALIGN ((size_t)512)
/* cuda.h's handles of the legacy and the per-thread default stream. */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
/* Device ordinals the shim asks the driver about. */
#define MAX_ORDINALS 64

#define EXPORT __attribute__((visibility("default")))

/* The shim's own definitions, declared with the driver's prototypes
 * (hooks/cuda.h, checked against the toolkit's cuda.h). */
#define DECLARE_1(sym, ret, params) EXPORT ret sym params;
#define DECLARE_0(sym, ret, params)
#define DECLARE(f, sym, defined, ret, params) DECLARE_##defined(sym, ret, params)
SHIM_CUDA_DRIVER(DECLARE)
#undef DECLARE
#undef DECLARE_0
#undef DECLARE_1

typedef struct driver {
#define FIELD(f, sym, defined, ret, params) ret(*f) params;
    SHIM_CUDA_DRIVER(FIELD)
#undef FIELD
} driver;

static bool driver_complete(const void *table)
{
    const driver *d = table;
    return d->mem_alloc && d->mem_free && d->mem_get_info;
}

/* The real functions (runtime_table.h): from a handle of the driver
 * library (dlsym route), or the process's scopes (link-time route). */
SHIM_RT_TABLE(static, driver_table, driver, SHIM_CUDA_DRIVER, driver_complete,
              "cuda: the driver's memory functions were not found in the process");
static _Atomic bool routed; /* the runtime got our cuMemAlloc_v2 from cuGetProcAddress */

/* The table, for every entry point: learnt from the process's scopes on
 * first use unless a route learnt it before. NULL while no driver is
 * loaded. */
static inline driver *get_driver(void)
{
    return shim_rt_table_get(&driver_table);
}

/* The published table, for the allocator's callbacks (a device exists:
 * a hook learnt it). */
static inline driver *the_driver(void)
{
    return shim_rt_table_peek(&driver_table);
}

bool shim_cuda_driver_routed(void)
{
    return atomic_load_explicit(&routed, memory_order_relaxed);
}

/* ---- the driver as a shim_runtime ------------------------------------ */

/* The calling thread's capture mode (the driver's default, global, when
 * it cannot tell). */
static CUstreamCaptureMode capture_mode(driver *d)
{
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (!d->exchange_capture_mode || d->exchange_capture_mode(&m) != CUDA_SUCCESS)
        return CU_STREAM_CAPTURE_MODE_GLOBAL;
    CUstreamCaptureMode back = m;
    d->exchange_capture_mode(&back);
    return m;
}

/* A region: never while the thread may be capturing. Where the driver
 * would refuse a cuMemAlloc (global or thread-local mode) the answer is
 * its refusal, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, at once; in relaxed
 * mode (the driver would allow it) out-of-memory, which makes the
 * allocator go on without a wait or a collection (room.c) and fail. */
static int drv_reserve(void **ptr, size_t size)
{
    driver *d = the_driver();
    if (shim_cuda_capturing())
        return capture_mode(d) == CU_STREAM_CAPTURE_MODE_RELAXED
                   ? CUDA_ERROR_OUT_OF_MEMORY
                   : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUdeviceptr p = 0;
    CUresult rc = d->mem_alloc(&p, size);
    *ptr = (void *)(uintptr_t)p;
    return rc;
}

static int drv_release(void *ptr)
{
    driver *d = the_driver();
    return d->mem_free((CUdeviceptr)(uintptr_t)ptr);
}

static int drv_mem_info(size_t *free, size_t *total)
{
    driver *d = the_driver();
    return d->mem_get_info(free, total);
}

/* The context current on the calling thread: the key of its regions. */
static int drv_current_context(uintptr_t *context)
{
    driver *d = the_driver();
    if (!d->ctx_get_current) {
        *context = 1; /* a driver without contexts to tell (a minimal one): one key */
        return CUDA_SUCCESS;
    }
    CUcontext c = NULL;
    CUresult rc = d->ctx_get_current(&c);
    if (rc != CUDA_SUCCESS)
        return (int)rc;
    if (!c)
        return CUDA_ERROR_INVALID_CONTEXT; /* what cuMemAlloc answers then */
    *context = (uintptr_t)c;
    return CUDA_SUCCESS;
}

/* The same with its device: asked once per context (the device is
 * made then). */
static int drv_current_device(int *ordinal, uintptr_t *context)
{
    driver *d = the_driver();
    int rc = drv_current_context(context);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUdevice dev = 0;
    rc = d->ctx_get_device ? (int)d->ctx_get_device(&dev) : CUDA_SUCCESS;
    *ordinal = dev;
    return rc;
}

static bool context_is_gone(CUresult rc)
{
    return rc == CUDA_ERROR_INVALID_CONTEXT || rc == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
           rc == CUDA_ERROR_DEINITIALIZED;
}

/* Waits for the work queued in `context`: cuCtxSynchronize when it is
 * current, else with it pushed for the wait (pushing an existing context
 * makes nothing; the shim never retains a primary context, which would
 * create one). */
static int drv_sync(int ordinal, uintptr_t context)
{
    (void)ordinal;
    driver *d = the_driver();
    if (!d->ctx_synchronize)
        return CUDA_SUCCESS;
    CUcontext want = (CUcontext)context, cur = NULL;
    if (!d->ctx_get_current || (d->ctx_get_current(&cur) == CUDA_SUCCESS && cur == want)) {
        CUresult rc = d->ctx_synchronize();
        return context_is_gone(rc) ? SHIM_SYNC_GONE : (int)rc;
    }
    if (!d->ctx_push || !d->ctx_pop)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult rc = d->ctx_push(want);
    if (rc == CUDA_SUCCESS) {
        rc = d->ctx_synchronize();
        CUcontext popped;
        d->ctx_pop(&popped);
    }
    if (!context_is_gone(rc))
        return (int)rc;
    shim_cuda_context_destroyed(want); /* the driver says it is gone */
    return SHIM_SYNC_GONE;
}

/* Whether the driver has a live allocation at `addr` (an address of a
 * region the shim forgot at its context's teardown). */
static bool drv_holds(uintptr_t addr)
{
    driver *d = the_driver();
    CUdeviceptr base = 0;
    size_t size = 0;
    return d->mem_get_address_range &&
           d->mem_get_address_range(&base, &size, (CUdeviceptr)addr) == CUDA_SUCCESS;
}

/* Devices are shared with the runtime route (hooks/cuda_runtime.c) by name. */
static const shim_runtime driver_rt = {
    .name = "cuda",
    .err_invalid = CUDA_ERROR_INVALID_VALUE,
    .err_oom = CUDA_ERROR_OUT_OF_MEMORY,
    .alignment = 256,
    .real_malloc = drv_reserve,
    .real_free = drv_release,
    .real_mem_info = drv_mem_info,
    .current_device = drv_current_device,
    .current_context = drv_current_context,
    .sync_device = drv_sync,
    .in_capture = shim_cuda_capturing,
    .contexts_of = shim_cuda_contexts_of,
    .holds = drv_holds,
};

/* Requests of at least this size are served from a region of their own
 * (SPYRESHIM_CUDA_IPC_MIN; SIZE_MAX: none), and so are all requests of the
 * objects SPYRESHIM_CUDA_IPC_CALLERS names. own_gate is what the common
 * path compares with: own_from, or 0 when objects are named (every request
 * then asks own_request). Set before any program code runs
 * (register_driver_lookup), read without a lock. */
static size_t own_from = SIZE_MAX, own_gate = SIZE_MAX;

/* Off the common path: whether a request past own_gate gets a region of
 * its own. */
static __attribute__((noinline)) bool own_request(size_t size, const void *ret)
{
    return size >= own_from || shim_cuda_caller_exports(ret);
}

/* ---- served entry points --------------------------------------------- */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_device_in_backend())
        return drv->mem_alloc(dptr, size);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    shim_device *d;
    int rc = shim_device_for_caller(&driver_rt, &d);
    if (rc != 0)
        return rc;
    void *p = NULL;
    /* A request of SPYRESHIM_CUDA_IPC_MIN or more gets a region of its
     * own, which an IPC handle can name ("IPC" in docs/cuda.md). */
    rc = size >= own_gate && own_request(size, __builtin_return_address(0))
             ? shim_device_malloc_own(d, &p, size)
             : shim_device_malloc(d, &p, size);
    if (rc == 0)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_device_in_backend())
        return drv->mem_free(ptr);
    /* Managed memory is freed with cuMemFree: the driver's, then the
     * record (one relaxed load while none is live). */
    if (shim_passthrough_any(SHIM_PT_MANAGED) &&
        shim_passthrough_contains(SHIM_PT_MANAGED, (uintptr_t)ptr)) {
        CUresult rc = drv->mem_free(ptr);
        if (rc == CUDA_SUCCESS)
            shim_passthrough_remove(SHIM_PT_MANAGED, (uintptr_t)ptr);
        return rc;
    }
    return shim_device_free_any(&driver_rt, NULL, (void *)(uintptr_t)ptr);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_device_in_backend())
        return drv->mem_get_info(free, total);
    shim_device *d;
    int rc = shim_device_for_caller(&driver_rt, &d);
    return rc ? rc : shim_device_mem_info(d, free, total);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                   size_t height, unsigned element_size)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_device_in_backend() && drv->mem_alloc_pitch)
        return drv->mem_alloc_pitch(dptr, pitch, width, height, element_size);
    if (!dptr || !pitch || width == 0 || height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (element_size != 4 && element_size != 8 && element_size != 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX - PITCH_ALIGN)
        return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + PITCH_ALIGN - 1) & ~(PITCH_ALIGN - 1);
    if (height > SIZE_MAX / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = cuMemAlloc_v2(dptr, p * height);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}

/* What the shim knows of `ptr` (nothing inside its own calls). */
static enum shim_block_state block_info(CUdeviceptr ptr, shim_block_info *bi)
{
    if (shim_device_in_backend())
        return SHIM_BLOCK_NONE;
    return shim_device_block_info(&driver_rt, (uintptr_t)ptr, bi);
}

/* Pointer queries: a served block is the program's allocation, so the
 * range and the buffer id describe it, not the region it was carved from
 * (the context, device and memory type are the region's, which are the
 * block's). An address in a region that is no live block (freed, waiting
 * for the device, slack, or forgotten with its context) is answered as the
 * driver answers an address it never allocated. */
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_get_address_range)
        return CUDA_ERROR_NOT_INITIALIZED;
    shim_block_info bi;
    switch (block_info(ptr, &bi)) {
    case SHIM_BLOCK_LIVE:
        if (base)
            *base = (CUdeviceptr)bi.base;
        if (size)
            *size = bi.size;
        return CUDA_SUCCESS;
    case SHIM_BLOCK_DEAD:
        return CUDA_ERROR_NOT_FOUND;
    default:
        return drv->mem_get_address_range(base, size, ptr);
    }
}

/* One attribute of a live block the shim answers itself: true when it did. */
static bool block_attribute(const shim_block_info *bi, CUpointer_attribute attribute, void *data)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (CUdeviceptr)bi->base;
        return true;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = bi->size;
        return true;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = bi->id;
        return true;
    default:
        return false;
    }
}

EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv || !drv->pointer_get_attribute)
        return CUDA_ERROR_NOT_INITIALIZED;
    shim_block_info bi;
    switch (block_info(ptr, &bi)) {
    case SHIM_BLOCK_LIVE:
        if (!data)
            return CUDA_ERROR_INVALID_VALUE;
        if (block_attribute(&bi, attribute, data))
            return CUDA_SUCCESS;
        return drv->pointer_get_attribute(data, attribute, ptr);
    case SHIM_BLOCK_DEAD:
        return CUDA_ERROR_INVALID_VALUE; /* the driver's answer for an unknown address */
    default:
        return drv->pointer_get_attribute(data, attribute, ptr);
    }
}

EXPORT CUresult cuPointerGetAttributes(unsigned n, CUpointer_attribute *attributes, void **data,
                                       CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv || !drv->pointer_get_attributes)
        return CUDA_ERROR_NOT_INITIALIZED;
    shim_block_info bi;
    switch (block_info(ptr, &bi)) {
    case SHIM_BLOCK_LIVE: {
        CUresult rc = drv->pointer_get_attributes(n, attributes, data, ptr);
        if (rc != CUDA_SUCCESS || !attributes || !data)
            return rc;
        for (unsigned i = 0; i < n; i++)
            if (data[i])
                block_attribute(&bi, attributes[i], data[i]);
        return CUDA_SUCCESS;
    }
    case SHIM_BLOCK_DEAD:
        /* The driver fills in its defaults for an address it does not
         * know: ask it about one it cannot know. */
        return drv->pointer_get_attributes(n, attributes, data, 0);
    default:
        return drv->pointer_get_attributes(n, attributes, data, ptr);
    }
}

/* Stream-ordered free of a served block: the shim's own free. Work queued
 * on `stream` before it is covered like any other: the block waits for a
 * wait on every live context of its device before it is handed out again. */
static CUresult free_async(CUresult (*real)(CUdeviceptr, CUstream), CUdeviceptr ptr,
                           CUstream stream)
{
    shim_block_info bi;
    if (ptr && block_info(ptr, &bi) != SHIM_BLOCK_NONE)
        return shim_device_free_any(&driver_rt, NULL, (void *)(uintptr_t)ptr);
    if (!real)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* Stream-ordered memory, or managed memory freed stream-ordered: the
     * driver's free, then the record (the program no longer holds it; the
     * pool reuses it in stream order, which is the driver's business; a
     * thread given the address again meanwhile keeps its own record:
     * shim_passthrough_remove takes the oldest). */
    CUresult rc = real(ptr, stream);
    if (rc == CUDA_SUCCESS && !shim_device_in_backend() && ptr &&
        !shim_passthrough_remove(SHIM_PT_ASYNC, (uintptr_t)ptr))
        shim_passthrough_remove(SHIM_PT_MANAGED, (uintptr_t)ptr); /* one load when none */
    return rc;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    return free_async(drv->mem_free_async, ptr, stream);
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream stream)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    return free_async(drv->mem_free_async_ptsz, ptr, stream);
}

/* ---- stream-ordered allocation: passed through, watched -------------- */

/* The driver's pools serve cuMemAllocAsync and cuMemAllocFromPoolAsync in
 * stream order (a block freed on a stream is reused there at once and
 * elsewhere after the free's event; during a capture the allocation is a
 * graph node): only the driver can keep those rules, so the shim passes
 * them through and records what the program holds (family cuda-async, on
 * the device it is allocated on), docs/cuda.md. */
/* The device of a pool, by the driver's answers: the device whose
 * default or current pool it is, else the one device with read-write
 * access to it (a pool's own device always has it); -1 when the driver
 * cannot tell (then the calling context's device is charged). */
static int pool_ordinal(driver *drv, CUmemoryPool pool)
{
    CUmemoryPool q;
    for (int dev = 0; dev < MAX_ORDINALS && drv->device_get_default_mem_pool; dev++) {
        CUresult rc = drv->device_get_default_mem_pool(&q, dev);
        if (rc == CUDA_ERROR_INVALID_DEVICE)
            break;
        if ((rc == CUDA_SUCCESS && q == pool) ||
            (drv->device_get_mem_pool && drv->device_get_mem_pool(&q, dev) == CUDA_SUCCESS &&
             q == pool))
            return dev;
    }
    int found = -1;
    for (int dev = 0; dev < MAX_ORDINALS && drv->mem_pool_get_access; dev++) {
        CUmemLocation loc = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
        CUmemAccess_flags flags = 0;
        CUresult rc = drv->mem_pool_get_access(&flags, pool, &loc);
        if (rc != CUDA_SUCCESS)
            break; /* past the last device, or not a pool */
        if (flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
            if (found >= 0)
                return -1; /* shared with a peer: the driver does not say whose */
            found = dev;
        }
    }
    return found;
}

/* The device of a stream's context (the pool of cuMemAllocAsync is that
 * device's current one), -1 for the default streams and when the driver
 * cannot tell (the calling context's device then). */
static int stream_ordinal(driver *drv, CUstream stream)
{
    CUcontext c = NULL, cur = NULL;
    CUdevice dev = -1;
    if (!stream || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
        !drv->stream_get_ctx || drv->stream_get_ctx(stream, &c) != CUDA_SUCCESS || !c ||
        !drv->ctx_get_current || drv->ctx_get_current(&cur) != CUDA_SUCCESS || c == cur ||
        !drv->ctx_push || !drv->ctx_pop || !drv->ctx_get_device)
        return -1;
    if (drv->ctx_push(c) != CUDA_SUCCESS)
        return -1;
    if (drv->ctx_get_device(&dev) != CUDA_SUCCESS)
        dev = -1;
    CUcontext popped;
    drv->ctx_pop(&popped);
    return dev;
}

/* The device memory of `ordinal` is charged to, from the calling
 * context's device `d`: `d` itself when it is that device, else a
 * context the shim serves on `ordinal` (NULL when there is none: then
 * counted there, not limited). */
static shim_device *device_for(shim_device *d, int ordinal)
{
    if (ordinal < 0 || !d || shim_passthrough_ordinal(d) == ordinal)
        return d;
    return shim_device_of_ordinal(&driver_rt, ordinal);
}

/* Charged to the device it is allocated on (the pool's, or the stream's
 * for the device's current pool) before the driver is asked
 * (SPYRESHIM_LIMIT: over it, room is made as for a served request, then
 * out-of-memory; never a pressure event during a capture), given back when
 * the driver refuses; recorded when it accepts. `from_pool` NULL: the
 * device's current pool (cuMemAllocAsync). */
static CUresult alloc_async(CUresult (*plain)(CUdeviceptr *, size_t, CUstream),
                            CUresult (*from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream),
                            CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)
{
    shim_device *d = NULL;
    bool watch = !shim_device_in_backend();
    int ordinal = -1;
    if (!dptr || size == 0 || !watch || shim_device_for_caller(&driver_rt, &d) != 0) {
        d = NULL;
    } else {
        driver *drv = the_driver();
        ordinal = from_pool ? pool_ordinal(drv, pool) : stream_ordinal(drv, stream);
        d = device_for(d, ordinal);
    }
    if (d) {
        CUresult rc = shim_passthrough_charge(d, size);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    CUresult rc = plain ? plain(dptr, size, stream) : from_pool(dptr, size, pool, stream);
    if (rc != CUDA_SUCCESS) {
        if (d)
            shim_passthrough_uncharge(d, size);
        return rc;
    }
    if (d)
        shim_passthrough_add_charged(SHIM_PT_ASYNC, d, (uintptr_t)*dptr, size);
    else if (dptr && watch)
        shim_passthrough_add(SHIM_PT_ASYNC, ordinal, (uintptr_t)*dptr, size);
    return rc;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_alloc_async)
        return CUDA_ERROR_NOT_INITIALIZED;
    return alloc_async(drv->mem_alloc_async, NULL, dptr, size, NULL, stream);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t size, CUstream stream)
{
    driver *drv = get_driver();
    if (!drv || (!drv->mem_alloc_async_ptsz && !drv->mem_alloc_async))
        return CUDA_ERROR_NOT_INITIALIZED;
    return alloc_async(drv->mem_alloc_async_ptsz ? drv->mem_alloc_async_ptsz
                                                 : drv->mem_alloc_async,
                       NULL, dptr, size, NULL, stream);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                        CUstream stream)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_alloc_from_pool_async)
        return CUDA_ERROR_NOT_INITIALIZED;
    return alloc_async(NULL, drv->mem_alloc_from_pool_async, dptr, size, pool, stream);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t size, CUmemoryPool pool,
                                             CUstream stream)
{
    driver *drv = get_driver();
    if (!drv || (!drv->mem_alloc_from_pool_async_ptsz && !drv->mem_alloc_from_pool_async))
        return CUDA_ERROR_NOT_INITIALIZED;
    return alloc_async(NULL,
                       drv->mem_alloc_from_pool_async_ptsz ? drv->mem_alloc_from_pool_async_ptsz
                                                           : drv->mem_alloc_from_pool_async,
                       dptr, size, pool, stream);
}

/* A trim gives the pool's cached memory back to the device: what the
 * program holds does not change, so it is a trace event (pool trim, with
 * the bytes the pool's reservation went down by), not a count. */
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_pool_trim_to)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shim_device_in_backend())
        return drv->mem_pool_trim_to(pool, keep);
    cuuint64_t before = 0, after = 0;
    bool known = drv->mem_pool_get_attribute &&
                 drv->mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                             &before) == CUDA_SUCCESS;
    CUresult rc = drv->mem_pool_trim_to(pool, keep);
    if (rc != CUDA_SUCCESS)
        return rc;
    known = known && drv->mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                                  &after) == CUDA_SUCCESS;
    shim_passthrough_pool_trimmed((uintptr_t)pool, known && before > after ? before - after : 0);
    return rc;
}

/* ---- stream capture: seen, so that the allocator knows ----------------- */

static CUresult capture_begun(CUresult rc, CUstream stream, CUstreamCaptureMode mode)
{
    if (rc == CUDA_SUCCESS && !shim_device_in_backend())
        shim_cuda_capture_begun(stream, mode);
    return rc;
}

EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode)
{
    driver *drv = get_driver();
    if (!drv || !drv->stream_begin_capture)
        return CUDA_ERROR_NOT_INITIALIZED;
    return capture_begun(drv->stream_begin_capture(stream, mode), stream, mode);
}

EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode)
{
    driver *drv = get_driver();
    if (!drv || (!drv->stream_begin_capture_ptsz && !drv->stream_begin_capture))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->stream_begin_capture_ptsz ? drv->stream_begin_capture_ptsz(stream, mode)
                                                 : drv->stream_begin_capture(stream, mode);
    return capture_begun(rc, stream, mode);
}

/* The first ABI (CUDA 10.0): global mode. */
EXPORT CUresult cuStreamBeginCapture(CUstream stream)
{
    driver *drv = get_driver();
    if (!drv || (!drv->stream_begin_capture_v1 && !drv->stream_begin_capture))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->stream_begin_capture_v1
                      ? drv->stream_begin_capture_v1(stream)
                      : drv->stream_begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    return capture_begun(rc, stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream)
{
    driver *drv = get_driver();
    if (!drv)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (drv->stream_begin_capture_v1_ptsz)
        return capture_begun(drv->stream_begin_capture_v1_ptsz(stream), stream,
                             CU_STREAM_CAPTURE_MODE_GLOBAL);
    return cuStreamBeginCapture(stream);
}

/* The capture is over whenever the driver ends it: a graph, an
 * invalidated or an unjoined capture; "no capture" and "wrong thread"
 * leave it as it was. */
static CUresult capture_ended(CUresult rc, CUstream stream)
{
    if ((rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||
         rc == CUDA_ERROR_STREAM_CAPTURE_UNJOINED) && !shim_device_in_backend())
        shim_cuda_capture_ended(stream);
    return rc;
}

EXPORT CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    driver *drv = get_driver();
    if (!drv || !drv->stream_end_capture)
        return CUDA_ERROR_NOT_INITIALIZED;
    return capture_ended(drv->stream_end_capture(stream, graph), stream);
}

EXPORT CUresult cuStreamEndCapture_ptsz(CUstream stream, CUgraph *graph)
{
    driver *drv = get_driver();
    if (!drv || (!drv->stream_end_capture_ptsz && !drv->stream_end_capture))
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->stream_end_capture_ptsz ? drv->stream_end_capture_ptsz(stream, graph)
                                               : drv->stream_end_capture(stream, graph);
    return capture_ended(rc, stream);
}

/* ---- managed and host-pinned memory: passed through, watched ------- */

/* The driver allocates, registers and frees; the shim records what it
 * accepted (shim/alloc/passthrough.c: statistics per family, leak
 * records with stacks) and forgets what it freed. Managed memory is
 * under the device's SPYRESHIM_LIMIT; host-pinned memory is host memory,
 * under SPYRESHIM_HOST_LIMIT (shim/alloc/charge.c). A free the shim has no record of
 * goes to the driver unchanged, with its answer. */

/* cuMemAllocManaged's flags: CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST. */
#define ATTACH_GLOBAL 1u
#define ATTACH_HOST 2u

/* Charged to the device of the calling thread's context (the one it is
 * attached to, whose teardown frees it) before the driver is asked: over
 * SPYRESHIM_LIMIT, out-of-memory after the pressure event. A request the
 * driver refuses for its arguments or for want of a context is its
 * answer alone. */
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_alloc_managed)
        return CUDA_ERROR_NOT_INITIALIZED;
    shim_device *d = NULL;
    if (!dptr || size == 0 || (flags != ATTACH_GLOBAL && flags != ATTACH_HOST) ||
        shim_device_in_backend() || shim_device_for_caller(&driver_rt, &d) != 0)
        d = NULL;
    if (d) {
        CUresult rc = shim_passthrough_charge(d, size);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    CUresult rc = drv->mem_alloc_managed(dptr, size, flags);
    if (rc != CUDA_SUCCESS) {
        if (d)
            shim_passthrough_uncharge(d, size);
        return rc;
    }
    if (d)
        shim_passthrough_add_charged(SHIM_PT_MANAGED, d, (uintptr_t)*dptr, size);
    else if (dptr)
        shim_passthrough_add(SHIM_PT_MANAGED, -1, (uintptr_t)*dptr, size);
    return rc;
}

/* Host-pinned requests are charged to SPYRESHIM_HOST_LIMIT before the
 * driver is asked (nothing for a request it refuses for its arguments:
 * no pointer, no bytes). */
static bool host_charge(const void *p, size_t size)
{
    return !p || size == 0 || shim_passthrough_charge_host(size);
}

static CUresult host_allocated(CUresult rc, void **pp, size_t size)
{
    if (rc == CUDA_SUCCESS && pp)
        shim_passthrough_add_charged(SHIM_PT_HOST_PINNED, NULL, (uintptr_t)*pp, size);
    else if (pp && size != 0)
        shim_passthrough_uncharge_host(size);
    return rc;
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_host_alloc)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!host_charge(pp, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return host_allocated(drv->mem_host_alloc(pp, size, flags), pp, size);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_alloc_host)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!host_charge(pp, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return host_allocated(drv->mem_alloc_host(pp, size), pp, size);
}

EXPORT CUresult cuMemAllocHost(void **pp, unsigned size)
{
    driver *drv = get_driver();
    if (!drv || (!drv->mem_alloc_host_v1 && !drv->mem_alloc_host))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!host_charge(pp, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = drv->mem_alloc_host_v1 ? drv->mem_alloc_host_v1(pp, size)
                                         : drv->mem_alloc_host(pp, size);
    return host_allocated(rc, pp, size);
}

EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_host_register)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!host_charge(p, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    return host_allocated(drv->mem_host_register(p, size, flags), p ? &p : NULL, size);
}

EXPORT CUresult cuMemHostRegister(void *p, size_t size, unsigned flags)
{
    driver *drv = get_driver();
    if (!drv || (!drv->mem_host_register_v1 && !drv->mem_host_register))
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!host_charge(p, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = drv->mem_host_register_v1 ? drv->mem_host_register_v1(p, size, flags)
                                            : drv->mem_host_register(p, size, flags);
    return host_allocated(rc, p ? &p : NULL, size);
}

static CUresult host_freed(CUresult rc, void *p)
{
    if (rc == CUDA_SUCCESS)
        shim_passthrough_remove(SHIM_PT_HOST_PINNED, (uintptr_t)p);
    return rc;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_free_host)
        return CUDA_ERROR_NOT_INITIALIZED;
    return host_freed(drv->mem_free_host(p), p);
}

EXPORT CUresult cuMemHostUnregister(void *p)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_host_unregister)
        return CUDA_ERROR_NOT_INITIALIZED;
    return host_freed(drv->mem_host_unregister(p), p);
}

/* ---- virtual memory management: passed through, watched ------------- */

/* cuMemCreate's physical allocations are the family cuda-vmm, keyed by
 * handle, charged to SPYRESHIM_LIMIT of the device they are created on
 * (the calling context's device, or a context the shim serves on that
 * device: device_for; with none, counted there, not limited). A physical
 * allocation lives while its handle is not released or a mapping uses it
 * (the driver's rule): the record and the charge go when both are gone.
 * Every mapping is recorded on the handle's record (a handle may be mapped
 * at several addresses), and a leak report names the last one; a retain
 * is one more reference to release. Reservations, access and the
 * shareable handles go to the driver untouched; nothing is served from the
 * shim's regions, and pointer queries on a mapped address reach the driver
 * (no region of the shim holds it). */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_create)
        return CUDA_ERROR_NOT_INITIALIZED;
    shim_device *d = NULL;
    if (!handle || !prop || size == 0 || flags != 0 ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || shim_device_in_backend() ||
        shim_device_for_caller(&driver_rt, &d) != 0)
        d = NULL;
    else
        d = device_for(d, prop->location.id);
    if (d) {
        CUresult rc = shim_passthrough_charge(d, size);
        if (rc != CUDA_SUCCESS)
            return rc;
    }
    CUresult rc = drv->mem_create(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) {
        if (d)
            shim_passthrough_uncharge(d, size);
        return rc;
    }
    if (d)
        shim_passthrough_add_charged(SHIM_PT_VMM, d, (uintptr_t)*handle, size);
    else if (handle && prop)
        /* A host location's id is no device ordinal. */
        shim_passthrough_add(SHIM_PT_VMM,
                             prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id
                                                                                : -1,
                             (uintptr_t)*handle, size);
    return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_release)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->mem_release(handle);
    if (rc == CUDA_SUCCESS)
        shim_passthrough_release(SHIM_PT_VMM, (uintptr_t)handle);
    return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_map)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->mem_map(ptr, size, offset, handle, flags);
    if (rc == CUDA_SUCCESS)
        shim_passthrough_mapped(SHIM_PT_VMM, (uintptr_t)handle, (uintptr_t)ptr, size);
    return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_unmap)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->mem_unmap(ptr, size);
    if (rc == CUDA_SUCCESS)
        shim_passthrough_unmapped(SHIM_PT_VMM, (uintptr_t)ptr, size);
    return rc;
}

/* A handle of a mapped allocation, one more reference of it: the record
 * goes only once every reference is released and nothing maps it. */
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_retain_allocation_handle)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->mem_retain_allocation_handle(handle, addr);
    if (rc == CUDA_SUCCESS && handle && !shim_device_in_backend())
        shim_passthrough_retained(SHIM_PT_VMM, (uintptr_t)*handle);
    return rc;
}

/* ---- context teardown ----------------------------------------------- */

/* The driver decides whether a context goes: the shim forgets one only
 * after the driver's call succeeded (a refused cuCtxDestroy, of a primary
 * context say, leaves every block live), and for a primary context only
 * once the driver says it is no longer active. A primary context's handle
 * is the driver's answer to its retains (the same for a device for as long
 * as the process lives); nothing else is kept. Between the driver's
 * teardown and the forgetting another thread may be given the addresses
 * again: lookups find live regions before forgotten ones, and the
 * program may not use the dying context's blocks meanwhile. */
static _Atomic(CUcontext) primary[MAX_ORDINALS];

/* The driver freed every allocation of `ctx`. */
static void context_gone(CUcontext ctx)
{
    if (!ctx || shim_device_in_backend())
        return;
    shim_device_context_gone(&driver_rt, (uintptr_t)ctx);
}

static CUcontext primary_of(CUdevice dev)
{
    return dev >= 0 && dev < MAX_ORDINALS ? atomic_load(&primary[dev]) : NULL;
}

/* The driver answered `rc` to ending `ctx`: on success its memory is gone,
 * and the context leaves the registry (a later retain of a primary context
 * registers it again). */
static CUresult destroyed(CUresult rc, CUcontext ctx)
{
    if (rc == CUDA_SUCCESS) {
        context_gone(ctx);
        shim_cuda_context_destroyed(ctx);
    }
    return rc;
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    driver *drv = get_driver();
    if (!drv || !drv->ctx_destroy)
        return CUDA_ERROR_NOT_INITIALIZED;
    return destroyed(drv->ctx_destroy(ctx), ctx);
}

EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    driver *drv = get_driver();
    if (!drv || (!drv->ctx_destroy_v1 && !drv->ctx_destroy))
        return CUDA_ERROR_NOT_INITIALIZED;
    return destroyed(drv->ctx_destroy_v1 ? drv->ctx_destroy_v1(ctx) : drv->ctx_destroy(ctx), ctx);
}

/* A context made or retained: registered with its device, so that a freed
 * block waits for its work too (hooks/cuda_contexts.c). */
static CUresult created(CUresult rc, CUcontext *pctx, CUdevice dev)
{
    if (rc == CUDA_SUCCESS && pctx && !shim_device_in_backend())
        shim_cuda_context_created(*pctx, dev);
    return rc;
}

/* A new context: the driver hands out a handle no live context has, so
 * regions the shim still keeps under it belong to one that ended unseen
 * (the driver freed them). */
static CUresult made(CUresult rc, CUcontext *pctx, CUdevice dev)
{
    if (rc == CUDA_SUCCESS && pctx && !shim_device_in_backend())
        context_gone(*pctx);
    return created(rc, pctx, dev);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || !drv->ctx_create)
        return CUDA_ERROR_NOT_INITIALIZED;
    return made(drv->ctx_create(pctx, flags, dev), pctx, dev);
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned flags, CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || (!drv->ctx_create_v1 && !drv->ctx_create))
        return CUDA_ERROR_NOT_INITIALIZED;
    return made(drv->ctx_create_v1 ? drv->ctx_create_v1(pctx, flags, dev)
                                   : drv->ctx_create(pctx, flags, dev), pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                               unsigned flags, CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || !drv->ctx_create_v3)
        return CUDA_ERROR_NOT_INITIALIZED;
    return made(drv->ctx_create_v3(pctx, params, n, flags, dev), pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned flags,
                               CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || !drv->ctx_create_v4)
        return CUDA_ERROR_NOT_INITIALIZED;
    return made(drv->ctx_create_v4(pctx, params, flags, dev), pctx, dev);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || !drv->primary_ctx_retain)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->primary_ctx_retain(pctx, dev);
    if (rc == CUDA_SUCCESS && pctx && dev >= 0 && dev < MAX_ORDINALS)
        atomic_store(&primary[dev], *pctx);
    return created(rc, pctx, dev);
}

/* A release that succeeded: the context went if the driver says it is no
 * longer active (the last release). Without the driver's answer, kept. */
static CUresult primary_release(CUresult (*real)(CUdevice), CUdevice dev)
{
    CUresult rc = real(dev);
    driver *drv = the_driver();
    unsigned flags;
    int active = 1;
    if (rc == CUDA_SUCCESS && drv->primary_ctx_get_state &&
        drv->primary_ctx_get_state(dev, &flags, &active) == CUDA_SUCCESS && !active)
        destroyed(CUDA_SUCCESS, primary_of(dev));
    return rc;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || !drv->primary_ctx_release)
        return CUDA_ERROR_NOT_INITIALIZED;
    return primary_release(drv->primary_ctx_release, dev);
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || (!drv->primary_ctx_release_v1 && !drv->primary_ctx_release))
        return CUDA_ERROR_NOT_INITIALIZED;
    return primary_release(drv->primary_ctx_release_v1 ? drv->primary_ctx_release_v1
                                                       : drv->primary_ctx_release, dev);
}

/* A reset that succeeded freed every allocation of the context. */
static CUresult primary_reset(CUresult (*real)(CUdevice), CUdevice dev)
{
    return destroyed(real(dev), primary_of(dev));
}

/* cudaDeviceReset reaches this. */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || !drv->primary_ctx_reset)
        return CUDA_ERROR_NOT_INITIALIZED;
    return primary_reset(drv->primary_ctx_reset, dev);
}

EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    driver *drv = get_driver();
    if (!drv || (!drv->primary_ctx_reset_v1 && !drv->primary_ctx_reset))
        return CUDA_ERROR_NOT_INITIALIZED;
    return primary_reset(drv->primary_ctx_reset_v1 ? drv->primary_ctx_reset_v1
                                                   : drv->primary_ctx_reset, dev);
}

/* IPC: a handle names a whole driver allocation, and the importing process
 * maps it at its base. A served block can be exported when it is alone in
 * its region and starts it (a request of SPYRESHIM_CUDA_IPC_MIN or more
 * always is; one above half the region size usually is): the region is the block, the
 * driver's handle of it is right, and the region is marked so that it goes
 * back to the driver once the block is freed, never to another block. A
 * block carved out of a shared region is refused: a handle of the region
 * would let the other process read every other block in it. */
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv || !drv->ipc_get_mem_handle)
        return CUDA_ERROR_NOT_INITIALIZED;
    shim_block_info bi;
    enum shim_block_state st = block_info(ptr, &bi);
    if (st == SHIM_BLOCK_DEAD)
        return CUDA_ERROR_INVALID_VALUE; /* not an allocation: nothing to export */
    if (st == SHIM_BLOCK_NONE)
        return drv->ipc_get_mem_handle(handle, ptr);
    uintptr_t base;
    switch (shim_device_block_export(&driver_rt, (uintptr_t)ptr, &base)) {
    case 0:
        return drv->ipc_get_mem_handle(handle, (CUdeviceptr)base);
    case -1: {
        static _Atomic unsigned warned;
        if (atomic_fetch_add(&warned, 1) >= 3) {
        } else if (own_from != SIZE_MAX) {
            shim_warn("cuda: cuIpcGetMemHandle on %#lx: a block of %zu bytes that shares its "
                      "region with other blocks cannot be exported (refused: not supported); "
                      "blocks of SPYRESHIM_CUDA_IPC_MIN (%zu) bytes or more can",
                      (unsigned long)ptr, bi.size, own_from);
        } else {
            shim_warn("cuda: cuIpcGetMemHandle on %#lx: a block of %zu bytes that shares its "
                      "region with other blocks cannot be exported (refused: not supported); "
                      "set SPYRESHIM_CUDA_IPC_MIN (e.g. 2M) or SPYRESHIM_CUDA_IPC_CALLERS "
                      "to give the blocks a program exports a region of their own",
                      (unsigned long)ptr, bi.size);
        }
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    default:
        return CUDA_ERROR_INVALID_VALUE; /* freed meanwhile */
    }
}

/* ---- cuGetProcAddress ------------------------------------------------- */


/* What the shim serves, by the name cuGetProcAddress is asked for and the
 * per-symbol ABI version from which that name means the function below
 * (cudaTypedefs.h's PFN_<name>_v<version>); and by the exported name dlsym
 * is asked for. X(base name, from version, until version (exclusive; 0 =
 * none), exported name, wrapper). */
#define DRIVER_SERVED(X)                                                              \
    X("cuMemAlloc", 3020, 0, "cuMemAlloc_v2", cuMemAlloc_v2)                          \
    X("cuMemFree", 3020, 0, "cuMemFree_v2", cuMemFree_v2)                             \
    X("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2", cuMemGetInfo_v2)                    \
    X("cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2", cuMemAllocPitch_v2)           \
    X("cuMemGetAddressRange", 3020, 0, "cuMemGetAddressRange_v2", cuMemGetAddressRange_v2) \
    X("cuIpcGetMemHandle", 4010, 0, "cuIpcGetMemHandle", cuIpcGetMemHandle)           \
    X("cuPointerGetAttribute", 4000, 0, "cuPointerGetAttribute", cuPointerGetAttribute) \
    X("cuPointerGetAttributes", 7000, 0, "cuPointerGetAttributes", cuPointerGetAttributes) \
    X("cuMemFreeAsync", 11020, 0, "cuMemFreeAsync", cuMemFreeAsync)                  \
    X("cuMemFreeAsync", 11020, 0, "cuMemFreeAsync_ptsz", cuMemFreeAsync_ptsz)        \
    X("cuMemAllocManaged", 6000, 0, "cuMemAllocManaged", cuMemAllocManaged)          \
    X("cuMemHostAlloc", 2020, 0, "cuMemHostAlloc", cuMemHostAlloc)                   \
    X("cuMemAllocHost", 2000, 3020, "cuMemAllocHost", cuMemAllocHost)                \
    X("cuMemAllocHost", 3020, 0, "cuMemAllocHost_v2", cuMemAllocHost_v2)             \
    X("cuMemFreeHost", 2000, 0, "cuMemFreeHost", cuMemFreeHost)                      \
    X("cuMemHostRegister", 4000, 6050, "cuMemHostRegister", cuMemHostRegister)       \
    X("cuMemHostRegister", 6050, 0, "cuMemHostRegister_v2", cuMemHostRegister_v2)    \
    X("cuMemHostUnregister", 4000, 0, "cuMemHostUnregister", cuMemHostUnregister)    \
    X("cuMemCreate", 10020, 0, "cuMemCreate", cuMemCreate)                            \
    X("cuMemRelease", 10020, 0, "cuMemRelease", cuMemRelease)                         \
    X("cuMemMap", 10020, 0, "cuMemMap", cuMemMap)                                     \
    X("cuMemUnmap", 10020, 0, "cuMemUnmap", cuMemUnmap)                               \
    X("cuMemRetainAllocationHandle", 11000, 0, "cuMemRetainAllocationHandle",         \
      cuMemRetainAllocationHandle)                                                    \
    X("cuCtxDestroy", 2000, 4000, "cuCtxDestroy", cuCtxDestroy)                       \
    X("cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2", cuCtxDestroy_v2)                    \
    X("cuCtxCreate", 2000, 3020, "cuCtxCreate", cuCtxCreate)                          \
    X("cuCtxCreate", 3020, 11040, "cuCtxCreate_v2", cuCtxCreate_v2)                   \
    X("cuCtxCreate", 11040, 12050, "cuCtxCreate_v3", cuCtxCreate_v3)                  \
    X("cuCtxCreate", 12050, 0, "cuCtxCreate_v4", cuCtxCreate_v4)                      \
    X("cuDevicePrimaryCtxRetain", 7000, 0, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain) \
    X("cuDevicePrimaryCtxRelease", 7000, 11000, "cuDevicePrimaryCtxRelease",           \
      cuDevicePrimaryCtxRelease)                                                      \
    X("cuDevicePrimaryCtxRelease", 11000, 0, "cuDevicePrimaryCtxRelease_v2",          \
      cuDevicePrimaryCtxRelease_v2)                                                   \
    X("cuDevicePrimaryCtxReset", 7000, 11000, "cuDevicePrimaryCtxReset",               \
      cuDevicePrimaryCtxReset)                                                        \
    X("cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2",              \
      cuDevicePrimaryCtxReset_v2)                                                     \
    X("cuGetProcAddress", 11030, 12000, "cuGetProcAddress", cuGetProcAddress)         \
    X("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", cuGetProcAddress_v2)       \
    X("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync", cuMemAllocAsync)                \
    X("cuMemAllocAsync", 11020, 0, "cuMemAllocAsync_ptsz", cuMemAllocAsync_ptsz)      \
    X("cuMemAllocFromPoolAsync", 11020, 0, "cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync) \
    X("cuMemAllocFromPoolAsync", 11020, 0, "cuMemAllocFromPoolAsync_ptsz",            \
      cuMemAllocFromPoolAsync_ptsz)                                                   \
    X("cuMemPoolTrimTo", 11020, 0, "cuMemPoolTrimTo", cuMemPoolTrimTo)                \
    X("cuStreamBeginCapture", 10000, 10010, "cuStreamBeginCapture", cuStreamBeginCapture) \
    X("cuStreamBeginCapture", 10000, 10010, "cuStreamBeginCapture_ptsz",              \
      cuStreamBeginCapture_ptsz)                                                      \
    X("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2", cuStreamBeginCapture_v2) \
    X("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2_ptsz",               \
      cuStreamBeginCapture_v2_ptsz)                                                   \
    X("cuStreamEndCapture", 10000, 0, "cuStreamEndCapture", cuStreamEndCapture)       \
    X("cuStreamEndCapture", 10000, 0, "cuStreamEndCapture_ptsz", cuStreamEndCapture_ptsz)

/* The per-thread default stream variants cuGetProcAddress hands out for
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: X(base name, from, until,
 * wrapper). */
#define DRIVER_SERVED_PTSZ(X)                                                         \
    X("cuMemFreeAsync", 11020, 0, cuMemFreeAsync_ptsz)                                \
    X("cuMemAllocAsync", 11020, 0, cuMemAllocAsync_ptsz)                              \
    X("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync_ptsz)              \
    X("cuStreamBeginCapture", 10000, 10010, cuStreamBeginCapture_ptsz)                \
    X("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2_ptsz)                 \
    X("cuStreamEndCapture", 10000, 0, cuStreamEndCapture_ptsz)

static void *served_by_version(const char *symbol, int version, cuuint64_t flags)
{
    /* Functions that take a stream: the per-thread default stream variant
     * for that flag. */
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
#define MATCH_PTSZ(base, from, until, fn)                                               \
    if (strcmp(symbol, base) == 0 && version >= from && (until == 0 || version < until)) \
        return (void *)fn;
        DRIVER_SERVED_PTSZ(MATCH_PTSZ)
#undef MATCH_PTSZ
    }
#define MATCH(base, from, until, exported, fn)                                          \
    if (strcmp(symbol, base) == 0 && version >= from && (until == 0 || version < until)) \
        return (void *)fn;
    DRIVER_SERVED(MATCH)
#undef MATCH
    return NULL;
}

/* A successful lookup of the real cuGetProcAddress: swap in our wrapper. */
static void replace(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    if (!symbol || !pfn || !*pfn)
        return;
    void *ours = served_by_version(symbol, version, flags);
    if (!ours)
        return;
    if ((void *)ours == (void *)cuMemAlloc_v2 && !atomic_load(&routed)) {
        atomic_store(&routed, true);
        shim_debug("cuda: the runtime reaches the driver through cuGetProcAddress");
    }
    *pfn = ours;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags)
{
    driver *drv = get_driver();
    if (!drv || !drv->get_proc_address)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->get_proc_address(symbol, pfn, version, flags);
    if (rc == CUDA_SUCCESS)
        replace(symbol, pfn, version, flags);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    driver *drv = get_driver();
    if (!drv || !drv->get_proc_address_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->get_proc_address_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS)
        replace(symbol, pfn, version, flags);
    return rc;
}

/* ---- dlsym on a handle of the driver ----------------------------------- */

/* For dlsym(handle, name) (hooks/dlsym.c): the shim's wrapper when `name`
 * is a driver entry point the shim serves and `handle`'s object really
 * defines it (a CUDA driver); NULL for everything else. No lock held;
 * calls the loader. */
static void *driver_lookup(void *handle, const char *name, const void *caller)
{
    (void)caller;
    void *ours = NULL;
#define BY_NAME(base, from, until, exported, fn) \
    if (!ours && strcmp(name, exported) == 0)     \
        ours = (void *)fn;
    DRIVER_SERVED(BY_NAME)
#undef BY_NAME
    if (!ours)
        return NULL;
    /* Only where the handle's object (or its dependencies) defines the name
     * for real: any object that exports cuMemAlloc_v2 is a CUDA driver (the
     * real one, the toolkit's stub, a stand-in). */
    return shim_rt_table_lookup(&driver_table, handle, name, ours);
}

/* The pressure event's capture query (alloc/pressure.h): whether the
 * calling thread may be inside a stream capture, where a collection's
 * frees and waits would be captured or invalidate it. Two signs: the
 * thread's capture mode is not the default (PyTorch switches to relaxed
 * around its allocations while capturing), or the legacy stream of its
 * context would join a capture (a blocking stream is capturing: the
 * driver answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). Failure path only;
 * no shim lock held. */
static bool drv_may_be_capturing(void)
{
    driver *d = the_driver();
    if (!d)
        return false;
    if (d->exchange_capture_mode) {
        CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
        if (d->exchange_capture_mode(&m) == CUDA_SUCCESS) {
            CUstreamCaptureMode back = m;
            d->exchange_capture_mode(&back);
            if (m != CU_STREAM_CAPTURE_MODE_GLOBAL)
                return true;
        }
    }
    if (d->stream_get_capture_info) {
        CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
        cuuint64_t id = 0;
        CUresult rc = d->stream_get_capture_info(CU_STREAM_LEGACY, &st, &id);
        if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
            (rc == CUDA_SUCCESS && st != CU_STREAM_CAPTURE_STATUS_NONE))
            return true;
    }
    return false;
}

bool shim_cuda_capturing(void)
{
    return shim_cuda_capture_seen() || drv_may_be_capturing();
}

/* Before any program code runs (the shim is preloaded): dlsym on a driver
 * handle is answered from the first lookup on. */
__attribute__((constructor)) static void register_driver_lookup(void)
{
    shim_dlsym_set_lookup(driver_lookup);
    shim_pressure_set_capture_query(shim_cuda_capturing);
    size_t min = shim_opts()->cuda_ipc_min;
    own_from = min ? min : SIZE_MAX;
    own_gate = shim_cuda_exporters_init() ? 0 : own_from;
}
