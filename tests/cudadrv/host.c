/* host: page-locked host memory (cuMemAllocHost, cuMemHostAlloc,
 * cuMemHostRegister) and managed memory (cuMemAllocManaged).
 *
 * Both are host memory the program may touch: pinned allocations come
 * from mmap, registered ones are the caller's own, managed ones are host
 * memory too (the stand-in has no device to migrate them to; copies to and
 * from the device treat them as host buffers). A list of ranges, guarded
 * by `lock` (a leaf: nothing else is taken while it is held), says what
 * each range is, so that frees and pointer queries answer as the driver
 * does: cuMemFreeHost only for allocated pinned memory, cuMemFree for
 * managed memory, cuMemHostUnregister for registered ranges. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

struct range {
    struct range *next;
    char *p;
    size_t size;
    enum cd_host_kind kind;
    CUcontext ctx;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range *ranges;

bool cd_host_find(const void *p, struct cd_host *out)
{
    bool ok = false;
    pthread_mutex_lock(&lock);
    for (struct range *r = ranges; r && !ok; r = r->next)
        if ((const char *)p >= r->p && (const char *)p < r->p + r->size) {
            out->base = r->p;
            out->size = r->size;
            out->kind = r->kind;
            out->ctx = r->ctx;
            ok = true;
        }
    pthread_mutex_unlock(&lock);
    return ok;
}

static CUresult add(void *p, size_t size, enum cd_host_kind kind, CUcontext ctx)
{
    struct range *r = malloc(sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *r = (struct range){ .p = p, .size = size, .kind = kind, .ctx = ctx };
    pthread_mutex_lock(&lock);
    r->next = ranges;
    ranges = r;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

/* Removes the range that starts at p and is of `kind`; false if none. */
static bool take(void *p, enum cd_host_kind kind, size_t *size)
{
    struct range *found = NULL;
    pthread_mutex_lock(&lock);
    for (struct range **pp = &ranges; *pp; pp = &(*pp)->next)
        if ((*pp)->p == p && (*pp)->kind == kind) {
            found = *pp;
            *pp = found->next;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!found)
        return false;
    *size = found->size;
    free(found);
    return true;
}

static CUresult host_alloc(void **pp, size_t size, enum cd_host_kind kind)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Pinned and managed allocations are potentially unsafe during a
     * capture, as cuMemAlloc is. */
    if (cd_capture_refuses_unsafe_call())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = add(p, size, kind, ctx);
    if (rc) {
        munmap(p, size);
        return rc;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    if (Flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    return host_alloc(pp, bytesize, CD_HOST_PINNED);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(pp, bytesize, CD_HOST_PINNED);
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    return host_alloc(pp, bytesize, CD_HOST_PINNED);
}

CUresult cuMemFreeHost(void *p)
{
    CD_REQUIRE_INIT();
    size_t size;
    if (!take(p, CD_HOST_PINNED, &size))
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, size);
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!p || bytesize == 0 || (Flags & ~0xFu))
        return CUDA_ERROR_INVALID_VALUE;
    struct cd_host h;
    if (cd_host_find(p, &h) || cd_host_find((char *)p + bytesize - 1, &h))
        return 712; /* CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED */
    return add(p, bytesize, CD_HOST_REGISTERED, ctx);
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return cuMemHostRegister_v2(p, bytesize, Flags);
}

CUresult cuMemHostUnregister(void *p)
{
    CD_REQUIRE_INIT();
    size_t size;
    return take(p, CD_HOST_REGISTERED, &size) ? CUDA_SUCCESS
                                              : 713; /* CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED */
}

/* With unified addressing the device sees host memory at its host address. */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    CD_REQUIRE_INIT();
    struct cd_host h;
    if (!pdptr || Flags != 0 || !cd_host_find(p, &h) || h.kind == CD_HOST_MANAGED)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *pdptr, void *p, unsigned int Flags)
{
    CUdeviceptr d;
    CUresult rc = cuMemHostGetDevicePointer_v2(&d, p, Flags);
    if (rc == CUDA_SUCCESS && pdptr)
        *pdptr = (CUdeviceptr_v1)d;
    return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    void *p;
    CUresult rc = host_alloc(&p, bytesize, CD_HOST_MANAGED);
    if (rc == CUDA_SUCCESS)
        *dptr = (uintptr_t)p;
    return rc;
}

bool cd_host_free_managed(CUdeviceptr ptr)
{
    size_t size;
    if (!take((void *)(uintptr_t)ptr, CD_HOST_MANAGED, &size))
        return false;
    munmap((void *)(uintptr_t)ptr, size);
    return true;
}

bool cd_host_is_managed(CUdeviceptr ptr)
{
    struct cd_host h;
    return cd_host_find((const void *)(uintptr_t)ptr, &h) && h.kind == CD_HOST_MANAGED &&
           (uintptr_t)h.base == ptr;
}

/* The driver frees a context's managed memory when the context goes. */
void cd_host_free_context(CUcontext ctx)
{
    for (;;) {
        void *p = NULL;
        pthread_mutex_lock(&lock);
        for (struct range *r = ranges; r && !p; r = r->next)
            if (r->kind == CD_HOST_MANAGED && r->ctx == ctx)
                p = r->p;
        pthread_mutex_unlock(&lock);
        if (!p)
            return;
        cd_host_free_managed((CUdeviceptr)(uintptr_t)p);
    }
}

/* No profiler: starting and stopping it succeed and do nothing. */
CUresult cuProfilerStart(void)
{
    CD_REQUIRE_INIT();
    return CUDA_SUCCESS;
}

CUresult cuProfilerStop(void)
{
    CD_REQUIRE_INIT();
    return CUDA_SUCCESS;
}
