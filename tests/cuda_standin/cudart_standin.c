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
 * cudaIpcGetMemHandle, cudaIpcOpenMemHandle and cudaIpcCloseMemHandle reach
 * the driver the way the real runtime does: dlopen("libcuda.so.1"), one
 * dlsym of cuGetProcAddress_v2, then each function through it at its
 * per-symbol ABI version (cuIpcOpenMemHandle at 11000 is the _v2). They
 * work on driver memory (cuMemAlloc's), which is what the real runtime's
 * cudaMalloc returns; this file's own cudaMalloc memory has no bytes and
 * no driver behind it. The driver's error numbers are the runtime's for
 * every code these return (1, 101, 201, 205, 217, 400, 801). */
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

/* ---- IPC, through the driver ----------------------------------------- */

typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
typedef int (*get_proc_fn)(const char *, void **, int, unsigned long long, int *);

static struct {
    int (*get)(cudaIpcMemHandle_t *, unsigned long long);
    int (*open)(unsigned long long *, cudaIpcMemHandle_t, unsigned);
    int (*close)(unsigned long long);
} ipc;
static pthread_once_t ipc_once = PTHREAD_ONCE_INIT;

static void ipc_resolve(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    get_proc_fn gpa = h ? (get_proc_fn)dlsym(h, "cuGetProcAddress_v2") : NULL;
    if (!gpa)
        return;
    int st;
    if (gpa("cuIpcGetMemHandle", (void **)&ipc.get, 4010, 0, &st) != 0)
        ipc.get = NULL;
    if (gpa("cuIpcOpenMemHandle", (void **)&ipc.open, 11000, 0, &st) != 0)
        ipc.open = NULL;
    if (gpa("cuIpcCloseMemHandle", (void **)&ipc.close, 4010, 0, &st) != 0)
        ipc.close = NULL;
}

#define INSUFFICIENT_DRIVER 35

API int cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    pthread_once(&ipc_once, ipc_resolve);
    return ipc.get ? ipc.get(handle, (uintptr_t)devPtr) : INSUFFICIENT_DRIVER;
}

API int cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    pthread_once(&ipc_once, ipc_resolve);
    if (!ipc.open)
        return INSUFFICIENT_DRIVER;
    if (!devPtr)
        return 1;
    unsigned long long p = 0;
    int rc = ipc.open(&p, handle, flags);
    if (rc == 0)
        *devPtr = (void *)(uintptr_t)p;
    return rc;
}

API int cudaIpcCloseMemHandle(void *devPtr)
{
    pthread_once(&ipc_once, ipc_resolve);
    return ipc.close ? ipc.close((uintptr_t)devPtr) : INSUFFICIENT_DRIVER;
}
