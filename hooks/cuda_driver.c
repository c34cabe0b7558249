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
 *   asks shim_cuda_driver_lookup.
 *
 * Served: cuMemAlloc_v2, cuMemFree_v2, cuMemGetInfo_v2, cuMemAllocPitch_v2;
 * cuMemGetAddressRange_v2 answers for a served block, cuIpcGetMemHandle
 * refuses one. Everything else goes to the driver untouched.
 *
 * Owns: the real driver functions, resolved once into a table that is
 * published with one atomic store (no lock: resolving calls the loader,
 * whose lock a library constructor that allocates may hold while it waits
 * for us). Never dereferences a device address. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda.h"
#include "hooks.h"
#include "loader.h"
#include "log.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long cuuint64_t;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* cuMemAllocPitch's pitch: the driver rounds the width up to its pitch
 * alignment, 512 bytes on every GPU since Fermi
 * (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT is 32, the larger of the
 * two is what cudaMallocPitch returns). */
#define PITCH_ALIGN ((size_t)512)

/* The real functions the shim calls: X(field, symbol, return, parameters). */
#define DRIVER_REAL(X)                                                                        \
    X(mem_alloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr *, size_t))                          \
    X(mem_free, "cuMemFree_v2", CUresult, (CUdeviceptr))                                      \
    X(mem_get_info, "cuMemGetInfo_v2", CUresult, (size_t *, size_t *))                        \
    X(mem_alloc_pitch, "cuMemAllocPitch_v2", CUresult,                                        \
      (CUdeviceptr *, size_t *, size_t, size_t, unsigned))                                    \
    X(mem_get_address_range, "cuMemGetAddressRange_v2", CUresult,                             \
      (CUdeviceptr *, size_t *, CUdeviceptr))                                                 \
    X(ipc_get_mem_handle, "cuIpcGetMemHandle", CUresult, (void *, CUdeviceptr))               \
    X(get_proc_address, "cuGetProcAddress", CUresult, (const char *, void **, int, cuuint64_t)) \
    X(get_proc_address_v2, "cuGetProcAddress_v2", CUresult,                                   \
      (const char *, void **, int, cuuint64_t, int *))                                        \
    X(ctx_get_device, "cuCtxGetDevice", CUresult, (CUdevice *))                               \
    X(ctx_synchronize, "cuCtxSynchronize", CUresult, (void))                                  \
    X(primary_ctx_retain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice))      \
    X(primary_ctx_release, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice))              \
    X(ctx_push, "cuCtxPushCurrent_v2", CUresult, (CUcontext))                                 \
    X(ctx_pop, "cuCtxPopCurrent_v2", CUresult, (CUcontext *))

typedef struct driver {
#define FIELD(f, sym, ret, params) ret(*f) params;
    DRIVER_REAL(FIELD)
#undef FIELD
} driver;

static _Atomic(driver *) the_driver;
static _Atomic bool routed; /* the runtime got our cuMemAlloc_v2 from cuGetProcAddress */

static bool is_ours(void *fn)
{
    /* The shim's load address, looked up once (racing threads store the
     * same value). */
    static _Atomic(void *) self_base;
    void *base = atomic_load_explicit(&self_base, memory_order_relaxed);
    if (!base) {
        Dl_info self;
        if (!shim_dladdr((void *)is_ours, &self))
            return false;
        base = self.dli_fbase;
        atomic_store_explicit(&self_base, base, memory_order_relaxed);
    }
    Dl_info di;
    return fn && shim_dladdr(fn, &di) && di.dli_fbase == base;
}

/* Publishes `d` unless another thread was first; returns the table in use. */
static driver *publish(driver *d)
{
    driver *expected = NULL;
    if (atomic_compare_exchange_strong(&the_driver, &expected, d))
        return d;
    free(d);
    return expected;
}

/* The table from a handle of the driver library (dlsym route). */
static driver *learn_from_handle(void *handle)
{
    driver *cur = atomic_load_explicit(&the_driver, memory_order_acquire);
    if (cur)
        return cur;
    driver *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
#define LOOKUP(f, sym, ret, params)                          \
    {                                                        \
        void *p = shim_real_dlsym(handle, sym);              \
        *(void **)&d->f = is_ours(p) ? NULL : p;             \
    }
    DRIVER_REAL(LOOKUP)
#undef LOOKUP
    if (!d->mem_alloc || !d->mem_free || !d->mem_get_info) {
        free(d);
        return NULL;
    }
    shim_debug("cuda: driver functions from a dlopen()ed handle");
    return publish(d);
}

/* The table from the process's scopes (link-time route), found without
 * loading anything. NULL while no driver is loaded. */
static driver *get_driver(void)
{
    driver *cur = atomic_load_explicit(&the_driver, memory_order_acquire);
    if (cur)
        return cur;
    driver *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
#define RESOLVE(f, sym, ret, params) *(void **)&d->f = shim_resolve_real(sym);
    DRIVER_REAL(RESOLVE)
#undef RESOLVE
    if (!d->mem_alloc || !d->mem_free || !d->mem_get_info) {
        free(d);
        static _Atomic bool warned;
        if (!atomic_exchange(&warned, true))
            shim_warn("cuda: the driver's memory functions were not found in the process");
        return NULL;
    }
    return publish(d);
}

bool shim_cuda_driver_routed(void)
{
    return atomic_load_explicit(&routed, memory_order_relaxed);
}

/* ---- the driver as a shim_runtime ------------------------------------ */

static int drv_reserve(void **ptr, size_t size)
{
    driver *d = atomic_load_explicit(&the_driver, memory_order_acquire);
    CUdeviceptr p = 0;
    CUresult rc = d->mem_alloc(&p, size);
    *ptr = (void *)(uintptr_t)p;
    return rc;
}

static int drv_release(void *ptr)
{
    driver *d = atomic_load_explicit(&the_driver, memory_order_acquire);
    return d->mem_free((CUdeviceptr)(uintptr_t)ptr);
}

static int drv_mem_info(size_t *free, size_t *total)
{
    driver *d = atomic_load_explicit(&the_driver, memory_order_acquire);
    return d->mem_get_info(free, total);
}

static int drv_current_device(int *ordinal)
{
    driver *d = atomic_load_explicit(&the_driver, memory_order_acquire);
    CUdevice dev = 0;
    CUresult rc = d->ctx_get_device ? d->ctx_get_device(&dev) : CUDA_SUCCESS;
    *ordinal = dev;
    return rc;
}

/* Waits for the work queued on device `ordinal`: the current context when
 * it is that device's (the usual case: blocks are freed where they were
 * used), else the device's primary context, made current for the wait. */
static int drv_sync(int ordinal)
{
    driver *d = atomic_load_explicit(&the_driver, memory_order_acquire);
    if (!d->ctx_synchronize)
        return CUDA_SUCCESS;
    int cur = -1;
    if (drv_current_device(&cur) == CUDA_SUCCESS && cur == ordinal)
        return d->ctx_synchronize();
    if (!d->primary_ctx_retain || !d->primary_ctx_release || !d->ctx_push || !d->ctx_pop)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUcontext ctx;
    CUresult rc = d->primary_ctx_retain(&ctx, ordinal);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = d->ctx_push(ctx);
    if (rc == CUDA_SUCCESS) {
        rc = d->ctx_synchronize();
        CUcontext popped;
        d->ctx_pop(&popped);
    }
    d->primary_ctx_release(ordinal);
    return rc;
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
    .sync_device = drv_sync,
};

/* ---- served entry points --------------------------------------------- */

#define EXPORT __attribute__((visibility("default")))

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
    rc = shim_device_malloc(d, &p, size);
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

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv || !drv->mem_get_address_range)
        return CUDA_ERROR_NOT_INITIALIZED;
    uintptr_t b;
    size_t n;
    /* A served block is the program's allocation: describe it, not the
     * region it was carved from. */
    if (!shim_device_in_backend() && shim_device_block_range(&driver_rt, (uintptr_t)ptr, &b, &n) == 0) {
        if (base)
            *base = (CUdeviceptr)b;
        if (size)
            *size = n;
        return CUDA_SUCCESS;
    }
    return drv->mem_get_address_range(base, size, ptr);
}

EXPORT CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr ptr)
{
    driver *drv = get_driver();
    if (!drv || !drv->ipc_get_mem_handle)
        return CUDA_ERROR_NOT_INITIALIZED;
    uintptr_t b;
    size_t n;
    if (shim_device_block_range(&driver_rt, (uintptr_t)ptr, &b, &n) == 0) {
        /* A handle describes a whole driver allocation: the importing
         * process would map the region's base, not this block. */
        static _Atomic unsigned warned;
        if (atomic_fetch_add(&warned, 1) < 3)
            shim_warn("cuda: cuIpcGetMemHandle on %#lx, a block the shim carved out of a larger "
                      "allocation: refused (not supported), since another process would map "
                      "the wrong address", (unsigned long)ptr);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    return drv->ipc_get_mem_handle(handle, ptr);
}

/* ---- cuGetProcAddress ------------------------------------------------- */

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, int *status);

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
    X("cuGetProcAddress", 11030, 12000, "cuGetProcAddress", cuGetProcAddress)         \
    X("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", cuGetProcAddress_v2)

static void *served_by_version(const char *symbol, int version)
{
#define MATCH(base, from, until, exported, fn)                                          \
    if (strcmp(symbol, base) == 0 && version >= from && (until == 0 || version < until)) \
        return (void *)fn;
    DRIVER_SERVED(MATCH)
#undef MATCH
    return NULL;
}

/* A successful lookup of the real cuGetProcAddress: swap in our wrapper. */
static void replace(const char *symbol, void **pfn, int version)
{
    if (!symbol || !pfn || !*pfn)
        return;
    void *ours = served_by_version(symbol, version);
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
        replace(symbol, pfn, version);
    return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    cuuint64_t flags, int *status)
{
    driver *drv = get_driver();
    if (!drv || !drv->get_proc_address_v2)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = drv->get_proc_address_v2(symbol, pfn, version, flags, status);
    if (rc == CUDA_SUCCESS)
        replace(symbol, pfn, version);
    return rc;
}

/* ---- dlsym on a handle of the driver ----------------------------------- */

void *shim_cuda_driver_lookup(void *handle, const char *name)
{
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
    void *real = shim_real_dlsym(handle, name);
    if (!real || is_ours(real))
        return NULL;
    if (!learn_from_handle(handle))
        return NULL;
    return ours;
}
