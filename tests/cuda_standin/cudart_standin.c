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
 * The stream-ordered functions (cudaMallocAsync, cudaFreeAsync,
 * cudaMallocFromPoolAsync, cudaDeviceGetDefaultMemPool) have no memory of
 * their own here: they reach the driver as the real runtime does, by
 * dlopen("libcuda.so.1") (LD_LIBRARY_PATH chooses the file: the stand-in
 * driver of tests/cudadrv), dlsym of cuGetProcAddress_v2 alone, and every
 * driver function through it at its ABI version (cuMemAllocAsync 11020),
 * on device 0's primary context made current on first use. Without a
 * driver they answer 35 (cudaErrorInsufficientDriver), as the runtime
 * does. */
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

/* ---- stream-ordered allocation: through the driver ----------------------- */

typedef int (*getproc_fn)(const char *, void **, int, unsigned long long, int *);
static struct {
    int (*alloc_async)(unsigned long long *, size_t, void *);
    int (*free_async)(unsigned long long, void *);
    int (*alloc_from_pool)(unsigned long long *, size_t, void *, void *);
    int (*default_pool)(void **, int);
} drv;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_error = 35; /* cudaErrorInsufficientDriver until the driver is there */

static void *fetch(getproc_fn getproc, const char *name, int version)
{
    void *fn = NULL;
    int status;
    return getproc(name, &fn, version, 0, &status) == 0 ? fn : NULL;
}

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    getproc_fn getproc = h ? (getproc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!getproc)
        return;
    int (*init)(unsigned) = fetch(getproc, "cuInit", 2000);
    int (*retain)(void **, int) = fetch(getproc, "cuDevicePrimaryCtxRetain", 7000);
    int (*get_current)(void **) = fetch(getproc, "cuCtxGetCurrent", 4000);
    int (*set_current)(void *) = fetch(getproc, "cuCtxSetCurrent", 4000);
    drv.alloc_async = fetch(getproc, "cuMemAllocAsync", 11020);
    drv.free_async = fetch(getproc, "cuMemFreeAsync", 11020);
    drv.alloc_from_pool = fetch(getproc, "cuMemAllocFromPoolAsync", 11020);
    drv.default_pool = fetch(getproc, "cuDeviceGetDefaultMemPool", 11020);
    void *ctx = NULL;
    if (!init || !retain || !get_current || !set_current || !drv.alloc_async ||
        !drv.free_async || !drv.alloc_from_pool || !drv.default_pool || init(0) != 0 ||
        get_current(&ctx) != 0)
        return;
    if (!ctx && (retain(&ctx, 0) != 0 || set_current(ctx) != 0))
        return;
    drv_error = 0;
}

/* 0 once the driver is loaded, else the runtime's error. */
static int driver_ready(void)
{
    pthread_once(&drv_once, load_driver);
    return drv_error;
}

API int cudaMallocAsync(void **ptr, size_t size, void *stream)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    unsigned long long p = 0;
    rc = drv.alloc_async(&p, size, stream);
    if (rc == 0 && ptr)
        *ptr = (void *)(uintptr_t)p;
    return rc;
}

API int cudaMallocFromPoolAsync(void **ptr, size_t size, void *pool, void *stream)
{
    int rc = driver_ready();
    if (rc)
        return rc;
    unsigned long long p = 0;
    rc = drv.alloc_from_pool(&p, size, pool, stream);
    if (rc == 0 && ptr)
        *ptr = (void *)(uintptr_t)p;
    return rc;
}

API int cudaFreeAsync(void *ptr, void *stream)
{
    int rc = driver_ready();
    return rc ? rc : drv.free_async((unsigned long long)(uintptr_t)ptr, stream);
}

API int cudaDeviceGetDefaultMemPool(void **pool, int device)
{
    int rc = driver_ready();
    return rc ? rc : drv.default_pool(pool, device);
}
