/* A model of one framework allocator's lock discipline at the driver call,
 * for the garbage-collection policy tests (tests/integration/
 * test_gc_frameworks.py) and bench/gc_policy.py. Built once per framework,
 * under the name of that framework's object, so that the shim's caller
 * lookup (python_gc/gc/policy.c) sees what it would see in the real one:
 *
 *   libc10_cuda.so     MODEL_TORCH: a recursive mutex held across
 *                      cuMemAlloc_v2 (the caching allocator); none with
 *                      PYTORCH_NO_CUDA_MEMORY_CACHING=1; released around the
 *                      call with PYTORCH_CUDA_ALLOC_CONF=...release_lock_on_cudamalloc:True
 *   librmm.so          MODEL_PLAIN: a plain mutex (RMM's pool)
 *   xla_extension.so   MODEL_XLA: a plain mutex (XLA's BFC), none with
 *                      XLA_PYTHON_CLIENT_ALLOCATOR=platform
 *   libnolock_model.so MODEL_NOLOCK: no lock (numba, uncached); the tests
 *                      copy it under cuda/bindings/ to play cuda.bindings
 *
 * The framework's free takes the same lock, as the real ones do. Called
 * through ctypes (CDLL releases the GIL, PyDLL keeps it). No cache: the
 * lock is what is modelled. Test code, never linked into the product. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemFree_v2(CUdeviceptr ptr);

#define API __attribute__((visibility("default")))

enum { LOCK_NONE, LOCK_RECURSIVE, LOCK_PLAIN };

static pthread_mutex_t mu;
static int kind;
static int release_around_call;

__attribute__((constructor)) static void model_init(void)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
#if defined(MODEL_TORCH)
    kind = LOCK_RECURSIVE;
    const char *nc = getenv("PYTORCH_NO_CUDA_MEMORY_CACHING");
    if (nc && strcmp(nc, "1") == 0)
        kind = LOCK_NONE;
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    release_around_call = conf && strstr(conf, "release_lock_on_cudamalloc:True") != NULL;
#elif defined(MODEL_XLA)
    kind = LOCK_PLAIN;
    const char *al = getenv("XLA_PYTHON_CLIENT_ALLOCATOR");
    if (al && strcmp(al, "platform") == 0)
        kind = LOCK_NONE;
#elif defined(MODEL_PLAIN)
    kind = LOCK_PLAIN;
#else
    kind = LOCK_NONE;
#endif
    if (kind == LOCK_RECURSIVE)
        pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&mu, &a);
    pthread_mutexattr_destroy(&a);
}

static void lock(void)
{
    if (kind != LOCK_NONE)
        pthread_mutex_lock(&mu);
}

static void unlock(void)
{
    if (kind != LOCK_NONE)
        pthread_mutex_unlock(&mu);
}

/* 0 none, 1 recursive, 2 plain; +16 when released around the driver call. */
API int model_lock_kind(void)
{
    return kind + (release_around_call ? 16 : 0);
}

API int model_alloc(size_t size, uint64_t *out)
{
    CUdeviceptr p = 0;
    lock();
    if (release_around_call)
        unlock();
    CUresult rc = cuMemAlloc_v2(&p, size);
    if (release_around_call)
        lock();
    unlock();
    *out = p;
    return rc;
}

API int model_free(uint64_t p)
{
    lock();
    CUresult rc = cuMemFree_v2((CUdeviceptr)p);
    unlock();
    return rc;
}
