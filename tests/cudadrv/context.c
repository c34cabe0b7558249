/* context: primary and created contexts, and each thread's context stack.
 *
 * Context objects are never freed: a destroyed context keeps its struct
 * with alive = false, so a stale handle is recognized (INVALID_CONTEXT)
 * instead of being a use after free. Every handle a caller passes is looked
 * up in the registry before it is dereferenced, which is also what lets
 * cuCtxGetDevice_v2 and cuCtxSynchronize_v2 survive callers (numba) that
 * bind them with the old prototypes and pass register garbage as the
 * context. `lock` guards the registry and every context's fields; it is
 * never held while waiting for streams. The stack is thread-local. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>

#define STACK_DEPTH 64

struct cd_ctx {
    CUdevice dev;
    unsigned flags;
    bool primary;
    bool alive;        /* primary: retained at least once since the last reset */
    int refs;          /* primary: retain count */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct cd_ctx primaries[CD_MAX_DEVICES];
static struct cd_ctx **created;
static size_t n_created, cap_created;

static __thread CUcontext stack[STACK_DEPTH];
static __thread int depth;

/* Lock held. */
static bool registered(CUcontext c)
{
    uintptr_t p = (uintptr_t)c, b = (uintptr_t)primaries;
    if (p >= b && p < b + sizeof primaries)
        return (p - b) % sizeof primaries[0] == 0
            && (p - b) / sizeof primaries[0] < (size_t)cd_opts.devices;
    for (size_t i = 0; i < n_created; i++)
        if (created[i] == c)
            return true;
    return false;
}

bool cd_context_alive(CUcontext c)
{
    pthread_mutex_lock(&lock);
    bool ok = c && registered(c) && c->alive;
    pthread_mutex_unlock(&lock);
    return ok;
}

CUcontext cd_context_current(void)
{
    CUcontext c = depth ? stack[depth - 1] : NULL;
    return c && cd_context_alive(c) ? c : NULL;
}

/* A created context destroyed by another thread while current here stays
 * on this thread's stack, and every call that needs it answers
 * CUDA_ERROR_CONTEXT_IS_DESTROYED (cuCtxDestroy's documentation; a primary
 * context's is never destroyed by cuCtxDestroy, and stays INVALID_CONTEXT).
 * A context's `primary` never changes: read without the lock. */
CUresult cd_context_require(CUcontext *out)
{
    CD_REQUIRE_INIT();
    CUcontext top = depth ? stack[depth - 1] : NULL;
    CUcontext c = cd_context_current();
    if (!c)
        return top && !top->primary ? CUDA_ERROR_CONTEXT_IS_DESTROYED
                                    : CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

/* The device never changes: no lock. */
CUdevice cd_context_device(CUcontext c)
{
    return c->dev;
}

/* Work queued in the context runs to completion, then its streams and
 * memory go: what destroying a context or resetting a primary one does. */
static void teardown(CUcontext c)
{
    cd_context_synchronize(c);
    cd_streams_drop_context(c);
    cd_memory_free_context(c);
    cd_host_free_context(c);
}

/* ---- primary contexts ---------------------------------------------------- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CD_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    struct cd_ctx *c = &primaries[dev];
    c->dev = dev;
    c->primary = true;
    c->refs++;
    c->alive = true;
    pthread_mutex_unlock(&lock);
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CD_REQUIRE_INIT();
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct cd_ctx *c = &primaries[dev];
    pthread_mutex_lock(&lock);
    bool last = false;
    CUresult rc = CUDA_SUCCESS;
    if (c->refs == 0)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else if (--c->refs == 0)
        last = true;
    pthread_mutex_unlock(&lock);
    if (last) {
        teardown(c);
        pthread_mutex_lock(&lock);
        if (c->refs == 0)
            c->alive = false;
        pthread_mutex_unlock(&lock);
    }
    return rc;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CD_REQUIRE_INIT();
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    struct cd_ctx *c = &primaries[dev];
    pthread_mutex_lock(&lock);
    bool was = c->alive;
    pthread_mutex_unlock(&lock);
    if (was)
        teardown(c);
    pthread_mutex_lock(&lock);
    c->refs = 0;
    c->alive = false;
    c->flags = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CD_REQUIRE_INIT();
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    *flags = primaries[dev].flags;
    *active = primaries[dev].alive;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    CD_REQUIRE_INIT();
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (flags & ~0xFFu)        /* CU_CTX_FLAGS_MASK */
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    primaries[dev].flags = flags;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

/* ---- created contexts ---------------------------------------------------- */

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    CD_REQUIRE_INIT();
    if (!pctx || (flags & ~0xFFu))
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (depth == STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct cd_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = dev;
    c->flags = flags;
    c->alive = true;
    pthread_mutex_lock(&lock);
    if (n_created == cap_created) {
        size_t ncap = cap_created ? 2 * cap_created : 16;
        struct cd_ctx **n = realloc(created, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&lock);
            free(c);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        created = n;
        cap_created = ncap;
    }
    created[n_created++] = c;
    pthread_mutex_unlock(&lock);
    stack[depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* CUDA 13's form: execution-affinity and CIG parameters are for devices
 * the stand-in does not model; without them it is cuCtxCreate_v2. */
CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    if (ctxCreateParams)
        return CUDA_ERROR_NOT_SUPPORTED;
    return cuCtxCreate_v2(pctx, flags, dev);
}

/* One priority level: the stand-in's streams all run alike. */
CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    CUcontext c;
    CUresult rc = cd_context_require(&c);
    if (rc)
        return rc;
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = 0;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CD_REQUIRE_INIT();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    bool ok = registered(ctx) && ctx->alive && !ctx->primary;
    pthread_mutex_unlock(&lock);
    if (!ok)
        return CUDA_ERROR_INVALID_CONTEXT;
    teardown(ctx);
    pthread_mutex_lock(&lock);
    ctx->alive = false;
    pthread_mutex_unlock(&lock);
    /* Only the calling thread's stack can be fixed up; other threads find
     * a dead context on theirs and get INVALID_CONTEXT, as with the driver. */
    if (depth && stack[depth - 1] == ctx)
        depth--;
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    return cuCtxDestroy_v2(ctx);
}

/* ---- the per-thread stack ------------------------------------------------ */

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CD_REQUIRE_INIT();
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_context_alive(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == STACK_DEPTH)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stack[depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    return cuCtxPushCurrent_v2(ctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CD_REQUIRE_INIT();
    if (depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = stack[--depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    return cuCtxPopCurrent_v2(pctx);
}

/* Replaces the top of the stack; NULL pops (no-op on an empty stack). */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CD_REQUIRE_INIT();
    if (!ctx) {
        if (depth)
            depth--;
        return CUDA_SUCCESS;
    }
    if (!cd_context_alive(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (depth == 0)
        depth = 1;
    stack[depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CD_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = depth ? stack[depth - 1] : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    CUcontext c;
    CUresult rc = cd_context_require(&c);
    if (rc)
        return rc;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

/* CUDA 13's form names the context. A NULL or unknown one means the
 * current context: see the file comment (numba passes garbage here). */
CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    CD_REQUIRE_INIT();
    if (ctx && cd_context_alive(ctx)) {
        if (!device)
            return CUDA_ERROR_INVALID_VALUE;
        *device = ctx->dev;
        return CUDA_SUCCESS;
    }
    return cuCtxGetDevice(device);
}

CUresult cuCtxSynchronize(void)
{
    CUcontext c;
    CUresult rc = cd_context_require(&c);
    if (rc)
        return rc;
    cd_capture_note_sync();
    if (cd_capture_refuses_unsafe_call())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    cd_context_synchronize(c);
    cd_mempool_sync_point();
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    CD_REQUIRE_INIT();
    if (ctx && cd_context_alive(ctx)) {
        cd_capture_note_sync();
        if (cd_capture_refuses_unsafe_call())
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        cd_context_synchronize(ctx);
        cd_mempool_sync_point();
        return CUDA_SUCCESS;
    }
    return cuCtxSynchronize();
}
