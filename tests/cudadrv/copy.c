/* copy: memset and memcpy, synchronous and queued.
 *
 * Arguments are checked when the call is made (as the driver does: a bad
 * pointer is an error of the call, not of the stream); the bytes move when
 * the stream's worker reaches the operation, through the device's
 * read-write view (memory.c). Synchronous forms are operations on the
 * legacy default stream that the caller waits for. No lock of its own:
 * the block lookups lock the device's allocator, queueing locks the
 * scheduler, and cuMemFree's wait for the device keeps a block alive until
 * every operation queued on it has run.
 *
 * A device pointer must belong to a live allocation of the current
 * context's device. Another device's pointer is refused with
 * CUDA_ERROR_INVALID_VALUE: that is what the driver's argument check
 * returns for an address it cannot resolve for the current context
 * (CUDA_ERROR_ILLEGAL_ADDRESS is a kernel's fault at run time and poisons
 * the context). A real driver with unified addressing would copy between
 * devices instead; the stand-in is stricter on purpose, so that tests
 * catch memory of one device used from another. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

enum kind { SET8, SET32, COPY, COPY_STAGED };

struct work {
    enum kind kind;
    char *dst;
    const char *src;
    size_t n;              /* bytes (SET32: elements) */
    unsigned value;
};

static void run(void *arg)
{
    struct work *w = arg;
    switch (w->kind) {
    case SET8:
        memset(w->dst, (int)(w->value & 0xff), w->n);
        break;
    case SET32:
        for (size_t i = 0; i < w->n; i++)
            memcpy(w->dst + 4 * i, &w->value, 4);
        break;
    case COPY:
        memmove(w->dst, w->src, w->n);
        break;
    case COPY_STAGED:
        memcpy(w->dst, w->src, w->n);
        free((void *)w->src);
        break;
    }
    free(w);
}

/* The read-write view of [p, p+len) on the current context's device, or
 * of host memory the device may address (pinned, registered, managed:
 * with unified addressing its device address is its host address). */
static CUresult device_range(CUcontext ctx, CUdeviceptr p, size_t len, char **rw)
{
    struct cd_block b;
    struct cd_host h;
    if (cd_host_find((void *)(uintptr_t)p, &h) && len <= (size_t)(h.base + h.size - (char *)p)) {
        *rw = (char *)(uintptr_t)p;
        return CUDA_SUCCESS;
    }
    if (!cd_memory_find(p, len, &b) || b.dev != cd_context_device(ctx) ||
        !cd_vmm_accessible(p, len, b.dev))
        return CUDA_ERROR_INVALID_VALUE;
    *rw = b.rw;
    return CUDA_SUCCESS;
}

/* A host range must not touch device addresses: the worker would fault. */
static CUresult host_range(const void *p, size_t len)
{
    if (!p || cd_memory_is_device(p, len))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* Queues w (taking it) on the stream, or runs it synchronously: queued on
 * the legacy stream and waited for. */
static CUresult submit(struct work *w, bool sync, CUstream stream)
{
    struct cd_mark done = { 0 };
    CUresult rc = cd_stream_enqueue(sync ? NULL : stream, run, w, NULL, sync ? &done : NULL);
    if (rc) {
        if (w->kind == COPY_STAGED)
            free((void *)w->src);
        free(w);
        return rc;
    }
    if (sync) {
        cd_mark_wait(&done);
        cd_mark_release(&done);
    }
    return CUDA_SUCCESS;
}

static CUresult memset_common(CUdeviceptr dst, unsigned value, size_t n, unsigned width,
                              bool sync, CUstream stream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (n == 0)
        return CUDA_SUCCESS;
    if (n > SIZE_MAX / width || dst % width)
        return CUDA_ERROR_INVALID_VALUE;
    char *rw;
    if ((rc = device_range(ctx, dst, n * width, &rw)))
        return rc;
    struct work *w = malloc(sizeof *w);
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *w = (struct work){ .kind = width == 1 ? SET8 : SET32, .dst = rw, .n = n, .value = value };
    return submit(w, sync, stream);
}

/* dst and src: device addresses or host pointers, as flagged. */
static CUresult copy_common(uintptr_t dst, bool dst_dev, uintptr_t src, bool src_dev,
                            size_t n, bool sync, CUstream stream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (n == 0)
        return CUDA_SUCCESS;
    char *d = (char *)dst;
    const char *s = (const char *)src;
    char *rw;
    if (dst_dev) {
        if ((rc = device_range(ctx, dst, n, &rw)))
            return rc;
        d = rw;
    } else if ((rc = host_range(d, n))) {
        return rc;
    }
    if (src_dev) {
        if ((rc = device_range(ctx, src, n, &rw)))
            return rc;
        s = rw;
    } else if ((rc = host_range(s, n))) {
        return rc;
    }
    struct work *w = malloc(sizeof *w);
    if (!w)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *w = (struct work){ .kind = COPY, .dst = d, .src = s, .n = n };
    /* From pageable host memory the real driver stages the bytes before
     * the call returns, so the caller may reuse its buffer at once. */
    if (!sync && !src_dev) {
        char *staged = malloc(n);
        if (!staged) {
            free(w);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(staged, s, n);
        w->src = staged;
        w->kind = COPY_STAGED;
    }
    return submit(w, sync, stream);
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return memset_common(dstDevice, uc, N, 1, true, NULL);
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return memset_common(dstDevice, ui, N, 4, true, NULL);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    return memset_common(dstDevice, uc, N, 1, false, hStream);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    return memset_common(dstDevice, ui, N, 4, false, hStream);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy_common(dstDevice, true, (uintptr_t)srcHost, false, ByteCount, true, NULL);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy_common((uintptr_t)dstHost, false, srcDevice, true, ByteCount, true, NULL);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy_common(dstDevice, true, srcDevice, true, ByteCount, true, NULL);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                              CUstream hStream)
{
    return copy_common(dstDevice, true, (uintptr_t)srcHost, false, ByteCount, false, hStream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream)
{
    return copy_common((uintptr_t)dstHost, false, srcDevice, true, ByteCount, false, hStream);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                              CUstream hStream)
{
    return copy_common(dstDevice, true, srcDevice, true, ByteCount, false, hStream);
}

/* Unified addressing: where each side lives follows from the address. */
CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return copy_common(dst, cd_memory_is_device((void *)(uintptr_t)dst, 1),
                       src, cd_memory_is_device((void *)(uintptr_t)src, 1), ByteCount, true, NULL);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return copy_common(dst, cd_memory_is_device((void *)(uintptr_t)dst, 1),
                       src, cd_memory_is_device((void *)(uintptr_t)src, 1), ByteCount, false,
                       hStream);
}
