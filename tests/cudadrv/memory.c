/* memory: each device's address range and its allocator.
 *
 * Every device has its own anonymous PROT_NONE reservation, so a host load
 * or store through a device pointer faults and the devices' ranges never
 * overlap. The bytes live at the same offsets in a second, private
 * read-write mapping that only the stream workers' copies touch (through
 * cd_block.rw). Both are MAP_NORESERVE: nothing is committed until written,
 * and a free gives whole pages back.
 *
 * The allocator keeps its metadata in host memory only: a sorted array of
 * live blocks per device, first fit over the gaps. Linear, which is plenty
 * for a test fixture and easy to trust. Each device's `lock` guards its
 * array and counters; no other lock is taken while it is held. The device
 * ranges themselves are fixed after cuInit and read without a lock. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The real driver hands out 512-byte aligned blocks (2 MiB granules, really,
 * but 512 is what the documentation promises and what suballocators use). */
#define ALIGN ((size_t)512)

struct block {
    size_t off;        /* from the device's base */
    size_t size;       /* rounded to ALIGN */
    size_t asked;
    CUcontext ctx;
    unsigned long long id;
};

/* Buffer ids: one counter for every device, never reused. */
static unsigned long long next_id;

static struct heap {
    pthread_mutex_t lock;
    char *base;        /* PROT_NONE: the device addresses */
    char *rw;          /* read-write, same offsets */
    size_t capacity;   /* cuMemGetInfo's total */
    size_t map_len;
    size_t used;       /* rounded bytes of live blocks */
    struct block *blocks;
    size_t n, cap;
} heaps[CD_MAX_DEVICES];

static size_t page_size;

bool cd_memory_init(void)
{
    page_size = (size_t)sysconf(_SC_PAGESIZE);
    for (int d = 0; d < cd_opts.devices; d++) {
        struct heap *h = &heaps[d];
        pthread_mutex_init(&h->lock, NULL);
        h->capacity = cd_opts.memory[d];
        h->map_len = (h->capacity + page_size - 1) & ~(page_size - 1);
        void *a = mmap(NULL, h->map_len, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void *w = mmap(NULL, h->map_len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (a == MAP_FAILED || w == MAP_FAILED) {
            fprintf(stderr, "cudastandin: cannot reserve %zu bytes for device %d\n",
                    h->capacity, d);
            return false;
        }
        h->base = a;
        h->rw = w;
    }
    return true;
}

/* The device whose range holds ptr, or -1. */
static int device_of(CUdeviceptr ptr)
{
    for (int d = 0; d < cd_opts.devices; d++) {
        uintptr_t b = (uintptr_t)heaps[d].base;
        if (ptr >= b && ptr - b < heaps[d].map_len)
            return d;
    }
    return -1;
}

/* Index of the last block with off <= off, or -1. Lock held. */
static ptrdiff_t find_le(const struct heap *h, size_t off)
{
    ptrdiff_t lo = 0, hi = (ptrdiff_t)h->n - 1, best = -1;
    while (lo <= hi) {
        ptrdiff_t mid = lo + (hi - lo) / 2;
        if (h->blocks[mid].off <= off) {
            best = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    return best;
}

bool cd_memory_find(CUdeviceptr ptr, size_t len, struct cd_block *out)
{
    int d = device_of(ptr);
    if (d < 0)
        return cd_vmm_find(ptr, len, out); /* a mapping of a reservation */
    struct heap *h = &heaps[d];
    size_t off = ptr - (uintptr_t)h->base;
    bool ok = false;
    pthread_mutex_lock(&h->lock);
    ptrdiff_t i = find_le(h, off);
    if (i >= 0) {
        const struct block *b = &h->blocks[i];
        size_t in = off - b->off;
        if (in < b->asked && len <= b->asked - in) {
            out->dev = d;
            out->base = (uintptr_t)h->base + b->off;
            out->size = b->asked;
            out->ctx = b->ctx;
            out->id = b->id;
            out->rw = h->rw + off;
            ok = true;
        }
    }
    pthread_mutex_unlock(&h->lock);
    return ok;
}

CUresult cd_memory_alloc(CUcontext ctx, size_t size, CUdeviceptr *out)
{
    struct heap *h = &heaps[cd_context_device(ctx)];
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > h->capacity)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t need = (size + ALIGN - 1) & ~(ALIGN - 1);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

    pthread_mutex_lock(&h->lock);
    if (h->n == h->cap) {
        size_t ncap = h->cap ? 2 * h->cap : 64;
        struct block *nb = realloc(h->blocks, ncap * sizeof *nb);
        if (!nb)
            goto out;
        h->blocks = nb;
        h->cap = ncap;
    }
    size_t at = 0, i;
    for (i = 0; i <= h->n; i++) {
        size_t gap_end = i < h->n ? h->blocks[i].off : h->capacity & ~(ALIGN - 1);
        if (gap_end >= at && gap_end - at >= need)
            break;
        if (i < h->n)
            at = h->blocks[i].off + h->blocks[i].size;
    }
    if (i > h->n)
        goto out;
    memmove(&h->blocks[i + 1], &h->blocks[i], (h->n - i) * sizeof *h->blocks);
    h->blocks[i] = (struct block){ .off = at, .size = need, .asked = size, .ctx = ctx,
                                   .id = __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED) };
    h->n++;
    h->used += need;
    *out = (uintptr_t)h->base + at;
    rc = CUDA_SUCCESS;
out:
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* Lock held. Gives back the pages that lie wholly inside the block: the
 * boundary pages may be shared with neighbours. */
static void remove_block(struct heap *h, size_t i)
{
    struct block b = h->blocks[i];
    memmove(&h->blocks[i], &h->blocks[i + 1], (h->n - i - 1) * sizeof *h->blocks);
    h->n--;
    h->used -= b.size;
    size_t start = (b.off + page_size - 1) & ~(page_size - 1);
    size_t end = (b.off + b.size) & ~(page_size - 1);
    if (end > start)
        madvise(h->rw + start, end - start, MADV_DONTNEED);
}

CUresult cd_memory_free(CUdeviceptr ptr)
{
    int d = device_of(ptr);
    if (d < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct heap *h = &heaps[d];
    size_t off = ptr - (uintptr_t)h->base;

    pthread_mutex_lock(&h->lock);
    ptrdiff_t i = find_le(h, off);
    bool live = i >= 0 && h->blocks[i].off == off;
    pthread_mutex_unlock(&h->lock);
    if (!live)
        return CUDA_ERROR_INVALID_VALUE;

    /* The real cuMemFree waits for the device: work queued before the free
     * may still use the block, and it must not be handed out again before
     * that work ran. Waiting outside the lock lets the workers finish.
     * Another thread may free it meanwhile: then cd_memory_free_now answers
     * a double free, as the driver sees it. */
    cd_device_synchronize(d);
    return cd_memory_free_now(ptr);
}

CUresult cd_memory_free_now(CUdeviceptr ptr)
{
    int d = device_of(ptr);
    if (d < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct heap *h = &heaps[d];
    size_t off = ptr - (uintptr_t)h->base;
    pthread_mutex_lock(&h->lock);
    ptrdiff_t i = find_le(h, off);
    bool live = i >= 0 && h->blocks[i].off == off;
    if (live)
        remove_block(h, (size_t)i);
    pthread_mutex_unlock(&h->lock);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

void cd_memory_free_context(CUcontext ctx)
{
    struct heap *h = &heaps[cd_context_device(ctx)];
    pthread_mutex_lock(&h->lock);
    for (size_t i = h->n; i-- > 0;)
        if (h->blocks[i].ctx == ctx)
            remove_block(h, i);
    pthread_mutex_unlock(&h->lock);
}

bool cd_memory_charge(CUdevice dev, size_t size)
{
    struct heap *h = &heaps[dev];
    pthread_mutex_lock(&h->lock);
    bool ok = size <= h->capacity && h->used <= h->capacity - size;
    if (ok)
        h->used += size;
    pthread_mutex_unlock(&h->lock);
    return ok;
}

void cd_memory_uncharge(CUdevice dev, size_t size)
{
    struct heap *h = &heaps[dev];
    pthread_mutex_lock(&h->lock);
    h->used -= size;
    pthread_mutex_unlock(&h->lock);
}

void cd_memory_info(CUdevice dev, size_t *free_bytes, size_t *total)
{
    struct heap *h = &heaps[dev];
    pthread_mutex_lock(&h->lock);
    size_t used = h->used;
    pthread_mutex_unlock(&h->lock);
    /* Rounding can make used exceed a capacity that is not a multiple of
     * ALIGN; never report a negative free. */
    *free_bytes = used < h->capacity ? h->capacity - used : 0;
    *total = h->capacity;
}

size_t cd_memory_capacity(CUdevice dev)
{
    return heaps[dev].capacity;
}

bool cd_memory_is_device(const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    uintptr_t e = a + len < a ? UINTPTR_MAX : a + len;
    for (int d = 0; d < cd_opts.devices; d++) {
        uintptr_t b = (uintptr_t)heaps[d].base;
        if (a < b + heaps[d].map_len && e > b)
            return true;
    }
    return false;
}

/* ---- the API ------------------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (cd_capture_refuses_unsafe_call())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return cd_memory_alloc(ctx, bytesize, dptr);
}

/* Any device's block may be freed from any context, and with no context
 * current at all, as with unified addressing (numba pops every context at
 * cuda.close() and then flushes its pending frees); only a block's start
 * is accepted. Managed memory is freed here too. */
CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CD_REQUIRE_INIT();
    if (cd_host_free_managed(dptr))
        return CUDA_SUCCESS;
    return cd_memory_free(dptr);
}

static void free_when_reached(void *arg)
{
    cd_memory_free_now((CUdeviceptr)(uintptr_t)arg);
}

static void free_managed_when_reached(void *arg)
{
    cd_host_free_managed((CUdeviceptr)(uintptr_t)arg);
}

/* Stream-ordered: the block is freed when the stream gets there. */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    /* Managed memory too, freed when the stream gets there. */
    if (cd_host_is_managed(dptr))
        return cd_stream_enqueue(hStream, free_managed_when_reached, (void *)(uintptr_t)dptr,
                                 NULL, NULL);
    struct cd_block b;
    if (!cd_memory_find(dptr, 1, &b) || b.base != dptr)
        return CUDA_ERROR_INVALID_VALUE;
    return cd_stream_enqueue(hStream, free_when_reached, (void *)(uintptr_t)dptr, NULL, NULL);
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    cd_memory_info(cd_context_device(ctx), free_bytes, total);
    return CUDA_SUCCESS;
}

/* Rows of WidthInBytes rounded up to the pitch alignment the driver uses
 * (512 bytes, the largest texture pitch alignment it reports); cuda.h
 * allows ElementSizeBytes of 4, 8 or 16 only. */
#define PITCH_ALIGN ((size_t)512)

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                            size_t Height, unsigned int ElementSizeBytes)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!dptr || !pPitch || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (WidthInBytes > SIZE_MAX - PITCH_ALIGN)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + PITCH_ALIGN - 1) & ~(PITCH_ALIGN - 1);
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = cd_memory_alloc(ctx, pitch * Height, dptr);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}
