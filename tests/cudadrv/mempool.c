/* mempool: stream-ordered allocation (cuMemAllocAsync, cuMemFreeAsync,
 * cuMemAllocFromPoolAsync and their _ptsz forms) and memory pools
 * (cuMemPoolCreate/Destroy/TrimTo/SetAttribute/GetAttribute,
 * cuDeviceGetDefaultMemPool, cuDeviceGetMemPool, cuDeviceSetMemPool,
 * cuMemPoolGetAccess/SetAccess), with
 * the driver's documented semantics:
 *
 * - a pool reserves chunks of its device's memory (memory.c, owned by no
 *   context: a context's teardown leaves them, as cuCtxDestroy leaves
 *   stream-ordered allocations) and hands them out whole;
 * - a chunk freed on stream S (cuMemFreeAsync) is reusable at once by
 *   allocations on S, and by allocations on other streams only once the
 *   free's place in S was reached (the work before it completed: what an
 *   event or a synchronization observes; CU_MEMPOOL_ATTR_REUSE_ALLOW_
 *   OPPORTUNISTIC, on by default; off, only S reuses it). Event
 *   dependencies between streams are not followed (stronger ordering,
 *   never weaker);
 * - at each synchronization (cuCtxSynchronize, cuStreamSynchronize,
 *   cuEventSynchronize) a pool gives back completed free chunks while it
 *   reserves more than its release threshold (default 0: everything);
 *   cuMemPoolTrimTo gives back down to the bytes to keep; an allocation
 *   that finds the device full gives back every completed free chunk of
 *   the device's pools and tries once more;
 * - CU_MEMPOOL_ATTR_RESERVED_MEM_* and USED_MEM_* count the chunks'
 *   (512-byte rounded) bytes reserved and handed out, with high-water
 *   marks that can only be reset to 0.
 * Allocation is legal during a stream capture (the real driver records a
 * graph node; here the memory is simply allocated, as work still runs).
 *
 * One mutex, `mu`, guards every pool and chunk. Lock order: mu, then
 * stream.c's scheduler lock (cd_mark_reached) or a device heap's lock
 * (memory.c); neither calls back here. Marks are taken (cd_stream_enqueue)
 * before mu. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define ALIGN ((size_t)512)

enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
};

struct chunk {
    struct chunk *next;
    CUdeviceptr ptr;
    size_t size;          /* rounded: what the pool reserved */
    CUstream freed_on;    /* free chunks: the stream of the free */
    struct cd_mark freed; /* ... and its place there */
};

struct cd_mempool {
    struct cd_mempool *next;
    CUdevice dev;
    bool is_default, destroyed;
    unsigned peers; /* other devices given read-write access, a bit each */
    int follow_events, opportunistic, internal_deps;
    cuuint64_t threshold;
    size_t reserved, used, reserved_high, used_high;
    struct chunk *live, *free;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct cd_mempool *pools;
static struct cd_mempool *defaults[CD_MAX_DEVICES], *current[CD_MAX_DEVICES];

/* mu held. */
static struct cd_mempool *pool_new(CUdevice dev, bool is_default)
{
    struct cd_mempool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->dev = dev;
    p->is_default = is_default;
    p->follow_events = p->opportunistic = p->internal_deps = 1;
    p->next = pools;
    pools = p;
    return p;
}

/* mu held. The device's default pool, made on first use. */
static struct cd_mempool *default_of(CUdevice dev)
{
    if (!defaults[dev])
        defaults[dev] = pool_new(dev, true);
    return defaults[dev];
}

/* mu held. A handle the program may use. */
static bool valid(CUmemoryPool h)
{
    for (struct cd_mempool *p = pools; p; p = p->next)
        if (p == h)
            return !p->destroyed;
    return false;
}

/* Streams are compared by what they name: the default handles all mean
 * the legacy stream here (stream.c). */
static CUstream canonical(CUstream s)
{
    return s == NULL || s == CU_STREAM_PER_THREAD ? CU_STREAM_LEGACY : s;
}

/* mu held. Gives the chunk's memory back to the device. */
static void give_back(struct cd_mempool *p, struct chunk *c)
{
    p->reserved -= c->size;
    cd_memory_free_now(c->ptr);
    cd_mark_release(&c->freed);
    free(c);
}

/* mu held. Gives back completed free chunks while the pool reserves more
 * than `keep`. */
static void release_completed(struct cd_mempool *p, size_t keep)
{
    for (struct chunk **cp = &p->free; *cp && p->reserved > keep;) {
        struct chunk *c = *cp;
        if (!cd_mark_reached(&c->freed)) {
            cp = &c->next;
            continue;
        }
        *cp = c->next;
        give_back(p, c);
    }
}

/* mu held. Unlinks and frees a destroyed pool once nothing of it is left. */
static void reap(struct cd_mempool *p)
{
    if (!p->destroyed || p->live || p->free)
        return;
    for (struct cd_mempool **pp = &pools; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    free(p);
}

void cd_mempool_sync_point(void)
{
    pthread_mutex_lock(&mu);
    for (struct cd_mempool *p = pools, *next; p; p = next) {
        next = p->next;
        release_completed(p, p->destroyed ? 0 : (size_t)p->threshold);
        reap(p);
    }
    pthread_mutex_unlock(&mu);
}

/* mu held. A reusable free chunk of `p` for `need` bytes on stream `s`:
 * freed on s, or (opportunistic reuse) its free completed. Chunks are
 * handed out whole, so one at most twice the request is taken. */
static struct chunk *reuse(struct cd_mempool *p, size_t need, CUstream s)
{
    for (struct chunk **cp = &p->free; *cp; cp = &(*cp)->next) {
        struct chunk *c = *cp;
        if (c->size < need || c->size / 2 > need)
            continue;
        if (c->freed_on != s && !(p->opportunistic && cd_mark_reached(&c->freed)))
            continue;
        *cp = c->next;
        cd_mark_release(&c->freed);
        return c;
    }
    return NULL;
}

static CUresult alloc_from(CUdeviceptr *dptr, size_t size, struct cd_mempool *want,
                           CUstream hStream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!dptr || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s = canonical(hStream);
    CUcontext sctx = ctx;
    bool nonblocking;
    if (s != CU_STREAM_LEGACY && !cd_stream_describe(s, &sctx, &nonblocking))
        return CUDA_ERROR_INVALID_HANDLE;
    size_t need = (size + ALIGN - 1) & ~(ALIGN - 1);
    if (need < size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    struct cd_mempool *p = want;
    if (p && !valid(p)) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!p) {
        /* The current pool of the stream's device. */
        CUdevice dev = cd_context_device(sctx);
        p = current[dev] ? current[dev] : default_of(dev);
        if (!p) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    struct chunk *c = reuse(p, need, s);
    if (!c) {
        CUdeviceptr at;
        rc = cd_memory_alloc_on(p->dev, NULL, need, &at);
        if (rc == CUDA_ERROR_OUT_OF_MEMORY) {
            /* The device is full: the completed frees of its pools go
             * back first. */
            for (struct cd_mempool *q = pools; q; q = q->next)
                if (q->dev == p->dev)
                    release_completed(q, 0);
            rc = cd_memory_alloc_on(p->dev, NULL, need, &at);
        }
        c = rc == CUDA_SUCCESS ? calloc(1, sizeof *c) : NULL;
        if (rc == CUDA_SUCCESS && !c) {
            cd_memory_free_now(at);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (rc) {
            pthread_mutex_unlock(&mu);
            return rc;
        }
        c->ptr = at;
        c->size = need;
        p->reserved += need;
        if (p->reserved > p->reserved_high)
            p->reserved_high = p->reserved;
    }
    c->freed_on = NULL;
    c->next = p->live;
    p->live = c;
    p->used += c->size;
    if (p->used > p->used_high)
        p->used_high = p->used;
    *dptr = c->ptr;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* mu held. The live chunk at ptr, unlinked, with its pool; NULL if none. */
static struct chunk *take_live(CUdeviceptr ptr, struct cd_mempool **owner)
{
    for (struct cd_mempool *p = pools; p; p = p->next)
        for (struct chunk **cp = &p->live; *cp; cp = &(*cp)->next)
            if ((*cp)->ptr == ptr) {
                struct chunk *c = *cp;
                *cp = c->next;
                *owner = p;
                return c;
            }
    return NULL;
}

bool cd_mempool_owns(CUdeviceptr ptr)
{
    pthread_mutex_lock(&mu);
    bool found = false;
    for (struct cd_mempool *p = pools; p && !found; p = p->next) {
        for (struct chunk *c = p->live; c && !found; c = c->next)
            found = c->ptr == ptr;
        for (struct chunk *c = p->free; c && !found; c = c->next)
            found = c->ptr == ptr;
    }
    pthread_mutex_unlock(&mu);
    return found;
}

static void free_when_reached(void *arg)
{
    cd_memory_free_now((CUdeviceptr)(uintptr_t)arg);
}

static void free_managed_when_reached(void *arg)
{
    cd_host_free_managed((CUdeviceptr)(uintptr_t)arg);
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    /* Managed memory too, freed when the stream gets there. */
    if (cd_host_is_managed(dptr))
        return cd_stream_enqueue(hStream, free_managed_when_reached, (void *)(uintptr_t)dptr,
                                 NULL, NULL);
    if (!cd_mempool_owns(dptr)) {
        /* cuMemAlloc's memory may be freed stream-ordered too: the block
         * goes when the stream gets there. */
        struct cd_block b;
        if (!cd_memory_find(dptr, 1, &b) || b.base != dptr)
            return CUDA_ERROR_INVALID_VALUE;
        return cd_stream_enqueue(hStream, free_when_reached, (void *)(uintptr_t)dptr, NULL,
                                 NULL);
    }
    /* The free's place in the stream, taken before the pools' lock. */
    struct cd_mark m = {0};
    rc = cd_stream_enqueue(hStream, NULL, NULL, NULL, &m);
    if (rc)
        return rc;
    pthread_mutex_lock(&mu);
    struct cd_mempool *p;
    struct chunk *c = take_live(dptr, &p);
    if (!c) {
        /* A chunk already freed (or freed by another thread meanwhile):
         * a double free. */
        pthread_mutex_unlock(&mu);
        cd_mark_release(&m);
        return CUDA_ERROR_INVALID_VALUE;
    }
    p->used -= c->size;
    c->freed_on = canonical(hStream);
    c->freed = m;
    c->next = p->free;
    p->free = c;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* ---- the API ------------------------------------------------------------- */

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_from(dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_from(dptr, bytesize, NULL, hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                 CUstream hStream)
{
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_from(dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                      CUstream hStream)
{
    return cuMemAllocFromPoolAsync(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    CD_REQUIRE_INIT();
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !cd_device_valid(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    /* No shareable handles here (IPC of pools is not modelled). */
    if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&mu);
    struct cd_mempool *p = pool_new(props->location.id, false);
    pthread_mutex_unlock(&mu);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = p;
    return CUDA_SUCCESS;
}

/* Live allocations stay valid; the pool goes once they are freed. A
 * device whose current pool it was gets its default one back. */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CD_REQUIRE_INIT();
    pthread_mutex_lock(&mu);
    if (!valid(pool) || pool->is_default) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    pool->destroyed = true;
    for (int d = 0; d < CD_MAX_DEVICES; d++)
        if (current[d] == pool)
            current[d] = NULL;
    release_completed(pool, 0);
    reap(pool);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CD_REQUIRE_INIT();
    pthread_mutex_lock(&mu);
    if (!valid(pool)) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    release_completed(pool, minBytesToKeep);
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CD_REQUIRE_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (!valid(pool)) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        pool->follow_events = *(int *)value != 0;
        break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        pool->opportunistic = *(int *)value != 0;
        break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        pool->internal_deps = *(int *)value != 0;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        pool->threshold = *(cuuint64_t *)value;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        /* Only a reset to 0 is allowed: the mark restarts from now. */
        if (*(cuuint64_t *)value != 0) {
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
            pool->reserved_high = pool->reserved;
        else
            pool->used_high = pool->used;
        break;
    default:
        rc = CUDA_ERROR_INVALID_VALUE; /* the current values are read-only */
    }
out:
    pthread_mutex_unlock(&mu);
    return rc;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CD_REQUIRE_INIT();
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (!valid(pool)) {
        rc = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        *(int *)value = pool->follow_events;
        break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        *(int *)value = pool->opportunistic;
        break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *(int *)value = pool->internal_deps;
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *(cuuint64_t *)value = pool->threshold;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->reserved;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        *(cuuint64_t *)value = pool->reserved_high;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        *(cuuint64_t *)value = pool->used;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        *(cuuint64_t *)value = pool->used_high;
        break;
    default:
        rc = CUDA_ERROR_INVALID_VALUE;
    }
out:
    pthread_mutex_unlock(&mu);
    return rc;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CD_REQUIRE_INIT();
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    struct cd_mempool *p = default_of(dev);
    pthread_mutex_unlock(&mu);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool_out = p;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CD_REQUIRE_INIT();
    if (!pool)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    struct cd_mempool *p = current[dev] ? current[dev] : default_of(dev);
    pthread_mutex_unlock(&mu);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = p;
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CD_REQUIRE_INIT();
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    if (!valid(pool) || pool->dev != dev)
        rc = CUDA_ERROR_INVALID_VALUE; /* a pool serves its own device only */
    else
        current[dev] = pool;
    pthread_mutex_unlock(&mu);
    return rc;
}

/* A pool's own device has read-write access to it, always; another device
 * once cuMemPoolSetAccess gave it (peer access is every pair's here). */
CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool,
                            CUmemLocation *location)
{
    CD_REQUIRE_INIT();
    if (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(location->id))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    bool ok = valid(memPool);
    if (ok)
        *flags = memPool->dev == location->id || (memPool->peers >> location->id & 1u)
                     ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                     : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    pthread_mutex_unlock(&mu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Read-write or none (a pool has no read-only access); the pool's own
 * device cannot lose its access. All or nothing: every entry is checked
 * before any applies. */
CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    CD_REQUIRE_INIT();
    if (!map && count)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            (map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE &&
             map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE))
            return CUDA_ERROR_INVALID_VALUE;
        if (!cd_device_valid(map[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&mu);
    CUresult rc = valid(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++)
        if (map[i].location.id == pool->dev && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            rc = CUDA_ERROR_INVALID_DEVICE;
    for (size_t i = 0; i < count && rc == CUDA_SUCCESS; i++) {
        unsigned bit = 1u << map[i].location.id;
        if (map[i].location.id == pool->dev)
            continue;
        pool->peers = map[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? pool->peers | bit
                                                                         : pool->peers & ~bit;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}
