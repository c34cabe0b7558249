/* A stand-in for the CUDA runtime's allocation entry points, for testing
 * hooks/cuda.c on machines without a GPU. Same names, shapes and error
 * numbers as libcudart (cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation
 * = 2), a fixed capacity (CUDA_STANDIN_MEMORY bytes, default 256 MiB), and
 * device addresses that are a PROT_NONE reservation: like real device
 * memory, the host cannot touch them. Its own calls are counted so that
 * tests can tell what reached the runtime and what the shim served.
 * CUDA_STANDIN_FAIL=N makes every cudaMalloc of a nonzero size return N
 * (e.g. 35, cudaErrorInsufficientDriver), read on each call so that a test
 * can switch it on and off.
 *
 * Host-pinned and managed memory (cudaHostAlloc, cudaMallocHost,
 * cudaFreeHost, cudaMallocManaged, and cudaFree of managed memory) come
 * from a driver, as the real runtime's do: it loads libcuda.so.1 by soname,
 * looks up cuGetProcAddress_v2 alone, fetches each driver function through
 * it at its ABI version, and makes the device's primary context current
 * first (cudaSetDevice's implicit initialization). Without a driver those
 * calls return 35 (cudaErrorInsufficientDriver), as the real runtime's do;
 * driver errors map to the runtime's (1, 2 are the same numbers). The
 * stream-ordered functions (cudaMallocAsync, cudaMallocFromPoolAsync,
 * cudaFreeAsync, cudaDeviceGetDefaultMemPool) come from the driver the
 * same way (cuMemAllocAsync & co. at 11020); a driver without them
 * answers 35 for those alone.
 * cudaIpcGetMemHandle, cudaIpcOpenMemHandle and cudaIpcCloseMemHandle come
 * from the driver the same way (cuIpcOpenMemHandle at 11000 is the _v2):
 * they work on driver memory (cuMemAlloc's), which is what the real
 * runtime's cudaMalloc returns; this file's own cudaMalloc memory has no
 * bytes behind it. The driver's numbers are the runtime's for every code
 * they return (1, 101, 201, 205, 217, 400, 801). */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define API __attribute__((visibility("default")))
#define MAXBLOCKS 4096

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t base;
static size_t capacity, used;
static struct { uintptr_t addr; size_t size; } blocks[MAXBLOCKS];
static size_t nblocks;
static uintptr_t next;

API unsigned standin_mallocs, standin_frees, standin_null_frees, standin_forced_failures;

static void init(void)
{
    if (base)
        return;
    const char *env = getenv("CUDA_STANDIN_MEMORY");
    capacity = env ? strtoull(env, NULL, 10) : (size_t)256 << 20;
    /* Address space only; the free list below never reuses it, so make it
     * generous. */
    void *p = mmap(NULL, capacity * 4, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    base = next = p == MAP_FAILED ? 0 : (uintptr_t)p;
}

static int do_malloc(void **ptr, size_t size)
{
    if (!ptr)
        return 1;
    const char *fail = getenv("CUDA_STANDIN_FAIL");
    if (fail && *fail && size != 0) {
        __atomic_fetch_add(&standin_forced_failures, 1, __ATOMIC_RELAXED);
        return atoi(fail);
    }
    pthread_mutex_lock(&mu);
    init();
    int rc = 0;
    size_t sz = (size + 255) & ~(size_t)255;
    if (size == 0) {
        *ptr = NULL;
    } else if (!base || used + sz > capacity || nblocks == MAXBLOCKS ||
               next + sz > base + capacity * 4) {
        rc = 2;
    } else {
        *ptr = (void *)next;
        blocks[nblocks].addr = next;
        blocks[nblocks++].size = sz;
        next += sz;
        used += sz;
        standin_mallocs++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API int cudaMalloc(void **ptr, size_t size)
{
    return do_malloc(ptr, size);
}

/* ---- through the driver, as the real runtime ------------------------- */

typedef int (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);
typedef struct { char reserved[64]; } cudaIpcMemHandle_t; /* CUipcMemHandle's layout */
static struct {
    int (*init)(unsigned);
    int (*primary_retain)(void **, int);
    int (*get_current)(void **);
    int (*set_current)(void *);
    int (*host_alloc)(void **, size_t, unsigned);
    int (*alloc_host)(void **, size_t);
    int (*free_host)(void *);
    int (*alloc_managed)(unsigned long long *, size_t, unsigned);
    int (*mem_free)(unsigned long long);
    int (*alloc_async)(unsigned long long *, size_t, void *);
    int (*free_async)(unsigned long long, void *);
    int (*alloc_from_pool)(unsigned long long *, size_t, void *, void *);
    int (*default_pool)(void **, int);
    /* Optional: the cudaIpc* functions answer 35 without them. */
    int (*ipc_get)(cudaIpcMemHandle_t *, unsigned long long);
    int (*ipc_open)(unsigned long long *, cudaIpcMemHandle_t, unsigned);
    int (*ipc_close)(unsigned long long);
    int err; /* 0, or why the runtime has no driver */
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *fetch(get_proc_fn gpa, const char *name, int version)
{
    void *fn = NULL;
    int status = 0;
    return gpa(name, &fn, version, 0, &status) == 0 ? fn : NULL;
}

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    get_proc_fn gpa = h ? (get_proc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa) {
        drv.err = 35; /* cudaErrorInsufficientDriver */
        return;
    }
    *(void **)&drv.init = fetch(gpa, "cuInit", 2000);
    *(void **)&drv.primary_retain = fetch(gpa, "cuDevicePrimaryCtxRetain", 7000);
    *(void **)&drv.get_current = fetch(gpa, "cuCtxGetCurrent", 4000);
    *(void **)&drv.set_current = fetch(gpa, "cuCtxSetCurrent", 4000);
    *(void **)&drv.host_alloc = fetch(gpa, "cuMemHostAlloc", 2020);
    *(void **)&drv.alloc_host = fetch(gpa, "cuMemAllocHost", 3020);
    *(void **)&drv.free_host = fetch(gpa, "cuMemFreeHost", 2000);
    *(void **)&drv.alloc_managed = fetch(gpa, "cuMemAllocManaged", 6000);
    *(void **)&drv.mem_free = fetch(gpa, "cuMemFree", 3020);
    *(void **)&drv.alloc_async = fetch(gpa, "cuMemAllocAsync", 11020);
    *(void **)&drv.free_async = fetch(gpa, "cuMemFreeAsync", 11020);
    *(void **)&drv.alloc_from_pool = fetch(gpa, "cuMemAllocFromPoolAsync", 11020);
    *(void **)&drv.default_pool = fetch(gpa, "cuDeviceGetDefaultMemPool", 11020);
    *(void **)&drv.ipc_get = fetch(gpa, "cuIpcGetMemHandle", 4010);
    *(void **)&drv.ipc_open = fetch(gpa, "cuIpcOpenMemHandle", 11000);
    *(void **)&drv.ipc_close = fetch(gpa, "cuIpcCloseMemHandle", 4010);
    if (!drv.init || !drv.primary_retain || !drv.get_current || !drv.set_current ||
        !drv.host_alloc || !drv.alloc_host || !drv.free_host || !drv.alloc_managed ||
        !drv.mem_free || drv.init(0) != 0)
        drv.err = 35;
}

/* The driver, with a context current on the calling thread (device 0's
 * primary context when none is): 0 or the runtime's error. */
static int driver_ready(void)
{
    pthread_once(&drv_once, load_driver);
    if (drv.err)
        return drv.err;
    void *ctx = NULL;
    if (drv.get_current(&ctx) == 0 && ctx)
        return 0;
    if (drv.primary_retain(&ctx, 0) != 0 || drv.set_current(ctx) != 0)
        return 3; /* cudaErrorInitializationError */
    return 0;
}

API int cudaHostAlloc(void **ptr, size_t size, unsigned flags)
{
    int rc = driver_ready();
    return rc ? rc : drv.host_alloc(ptr, size, flags);
}

API int cudaMallocHost(void **ptr, size_t size)
{
    int rc = driver_ready();
    return rc ? rc : drv.alloc_host(ptr, size);
}

API int cudaFreeHost(void *ptr)
{
    int rc = driver_ready();
    return rc ? rc : drv.free_host(ptr);
}

API int cudaMallocManaged(void **ptr, size_t size, unsigned flags)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    unsigned long long p = 0;
    rc = drv.alloc_managed(ptr ? &p : NULL, size, flags);
    if (rc == 0)
        *ptr = (void *)(uintptr_t)p;
    return rc;
}

/* Stream-ordered: 0 when the driver has them, else the runtime's error. */
static int async_ready(void)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    return drv.alloc_async && drv.free_async && drv.alloc_from_pool && drv.default_pool ? 0 : 35;
}

API int cudaMallocAsync(void **ptr, size_t size, void *stream)
{
    int rc = async_ready();
    if (rc)
        return rc;
    unsigned long long p = 0;
    rc = drv.alloc_async(ptr ? &p : NULL, size, stream);
    if (rc == 0)
        *ptr = (void *)(uintptr_t)p;
    return rc;
}

API int cudaMallocFromPoolAsync(void **ptr, size_t size, void *pool, void *stream)
{
    int rc = async_ready();
    if (rc)
        return rc;
    unsigned long long p = 0;
    rc = drv.alloc_from_pool(ptr ? &p : NULL, size, pool, stream);
    if (rc == 0)
        *ptr = (void *)(uintptr_t)p;
    return rc;
}

API int cudaFreeAsync(void *ptr, void *stream)
{
    int rc = async_ready();
    return rc ? rc : drv.free_async((uintptr_t)ptr, stream);
}

API int cudaDeviceGetDefaultMemPool(void **pool, int device)
{
    int rc = async_ready();
    return rc ? rc : drv.default_pool(pool, device);
}

API int cudaFree(void *ptr)
{
    pthread_mutex_lock(&mu);
    int rc = 1;
    if (!ptr) {
        standin_null_frees++;
        rc = 0;
    }
    for (size_t i = 0; ptr && i < nblocks; i++) {
        if (blocks[i].addr == (uintptr_t)ptr) {
            used -= blocks[i].size;
            blocks[i] = blocks[--nblocks];
            standin_frees++;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    /* Not one of its blocks: managed memory is the driver's. */
    if (rc != 0 && driver_ready() == 0)
        rc = drv.mem_free((uintptr_t)ptr);
    return rc;
}

API int cudaMemGetInfo(size_t *free, size_t *total)
{
    if (!free || !total)
        return 1;
    pthread_mutex_lock(&mu);
    init();
    *free = capacity - used;
    *total = capacity;
    pthread_mutex_unlock(&mu);
    return 0;
}

/* Allocates behind the shim's back (as memory from before it took over):
 * a direct call, not through the PLT, so the preloaded cudaMalloc does not
 * see it. */
API int standinRawMalloc(void **ptr, size_t size)
{
    return do_malloc(ptr, size);
}

/* ---- IPC, through the driver ------------------------------------------ */

API int cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    return drv.ipc_get ? drv.ipc_get(handle, (uintptr_t)devPtr) : 35;
}

API int cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    if (!drv.ipc_open)
        return 35;
    if (!devPtr)
        return 1;
    unsigned long long p = 0;
    rc = drv.ipc_open(&p, handle, flags);
    if (rc == 0)
        *devPtr = (void *)(uintptr_t)p;
    return rc;
}

API int cudaIpcCloseMemHandle(void *devPtr)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    return drv.ipc_close ? drv.ipc_close((uintptr_t)devPtr) : 35;
}
