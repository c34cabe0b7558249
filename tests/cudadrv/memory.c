/* memory: each device's address range and its allocator.
 *
 * Every device has its own anonymous PROT_NONE reservation, so a host load
 * or store through a device pointer faults and the devices' ranges never
 * overlap. The bytes live at the same offsets in a second, read-write
 * mapping that only the stream workers' copies touch (through
 * cd_block.rw): a shared mapping of one memfd per device, so that another
 * process can map an exported allocation's bytes (ipc.c). Nothing is
 * committed until written, and a free punches whole pages out of the file.
 *
 * IPC (the exporter's side; ipc.c has the importer's): the memfd holds,
 * past the device's bytes, one 8-byte slot per 512-byte unit: the buffer
 * id of the exported allocation that starts there, 0 when none. An
 * importer takes a read lock (an open-file-description lock) on the
 * allocation's byte range of the file, then checks the slot, so that an
 * allocation freed in the meantime is never opened. The real driver keeps
 * an allocation's memory while another process has it mapped (freeing it
 * first is undefined behaviour by the documentation): so a freed exported
 * block whose range some importer still locks stays here as a zombie (not
 * found, not reusable, counted as used) until no importer holds it; a
 * later allocation reaps zombies. Its bytes are never handed to another
 * owner while a peer can read them.
 *
 * The allocator keeps its metadata in host memory only: a sorted array of
 * live blocks per device, first fit over the gaps. Linear, which is plenty
 * for a test fixture and easy to trust. Each device's `lock` guards its
 * array and counters; no other lock is taken while it is held. The device
 * ranges themselves are fixed after cuInit and read without a lock. */
#include "internal.h"

#include <fcntl.h>
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
    /* Bit-fields in the id's word: the array is moved on every allocation
     * and free, and 40 bytes a block, not 48, is what the benchmark's
     * stand-in pair costs (bench/cuda_pair). Ids stay far below 2^62. */
    unsigned long long id : 62;
    unsigned long long exported : 1; /* an IPC handle was made for it */
    unsigned long long zombie : 1;   /* freed, but an importer still maps it */
};
_Static_assert(sizeof(struct block) == 40, "a block's record stays 40 bytes");

/* Buffer ids: one counter for every device, never reused. */
static unsigned long long next_id;

static struct heap {
    pthread_mutex_t lock;
    char *base;        /* PROT_NONE: the device addresses */
    char *rw;          /* read-write, same offsets: the memfd, shared */
    size_t capacity;   /* cuMemGetInfo's total */
    size_t map_len;
    size_t used;       /* rounded bytes of live blocks (and zombies) */
    struct block *blocks;
    size_t n, cap;
    int fd;            /* the memfd; -1 when it could not be made */
    bool forked;       /* this is a child's copy: no IPC, private bytes */
    size_t zombies;
} heaps[CD_MAX_DEVICES];

/* A random token per process, in the memfds' names: a handle names it,
 * so that an importer never maps a file of an unrelated process that
 * happens to reuse the exporter's pid and descriptor number. */
static unsigned long long token;

static size_t page_size;

static void reap_zombies(struct heap *h);

/* A memfd of `len` bytes (sparse), named after the device and the
 * process's token. Closed on exec: a program the process runs is another
 * process, which must import. */
static int make_memfd(int dev, size_t len)
{
    char name[64];
    snprintf(name, sizeof name, "cudastandin-%016llx-%d", token, dev);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd >= 0 && ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* A child of fork gets the parent's descriptors and shared mappings: its
 * writes and frees would change the parent's device memory. A real
 * driver's state does not survive fork at all; here the child keeps a
 * private copy-on-write view of the bytes and may not export them. */
static void child_after_fork(void)
{
    for (int d = 0; d < cd_opts.devices; d++) {
        struct heap *h = &heaps[d];
        if (h->fd < 0 || !h->rw)
            continue;
        mmap(h->rw, h->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
             h->fd, 0);
        h->forked = true;
    }
}

bool cd_memory_init(void)
{
    page_size = (size_t)sysconf(_SC_PAGESIZE);
    int ur = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (ur < 0 || read(ur, &token, sizeof token) != (ssize_t)sizeof token)
        token = (unsigned long long)getpid() * 0x9e3779b97f4a7c15ull ^ (uintptr_t)&token;
    if (ur >= 0)
        close(ur);
    pthread_atfork(NULL, NULL, child_after_fork);
    for (int d = 0; d < cd_opts.devices; d++) {
        struct heap *h = &heaps[d];
        pthread_mutex_init(&h->lock, NULL);
        h->capacity = cd_opts.memory[d];
        h->map_len = (h->capacity + page_size - 1) & ~(page_size - 1);
        void *a = mmap(NULL, h->map_len, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void *w = MAP_FAILED;
        h->fd = make_memfd(d, h->map_len + h->map_len / ALIGN * 8);
        if (h->fd >= 0)
            w = mmap(NULL, h->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                     h->fd, 0);
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
        /* A mapping of a reservation, or a range opened from another
         * process's handle. */
        return cd_vmm_find(ptr, len, out) || cd_ipc_find(ptr, len, out);
    struct heap *h = &heaps[d];
    size_t off = ptr - (uintptr_t)h->base;
    bool ok = false;
    pthread_mutex_lock(&h->lock);
    ptrdiff_t i = find_le(h, off);
    if (i >= 0) {
        const struct block *b = &h->blocks[i];
        size_t in = off - b->off;
        if (!b->zombie && in < b->asked && len <= b->asked - in) {
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
    return cd_memory_alloc_on(cd_context_device(ctx), ctx, size, out);
}

CUresult cd_memory_alloc_on(CUdevice dev, CUcontext ctx, size_t size, CUdeviceptr *out)
{
    struct heap *h = &heaps[dev];
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > h->capacity)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t need = (size + ALIGN - 1) & ~(ALIGN - 1);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

    pthread_mutex_lock(&h->lock);
    if (h->zombies)
        reap_zombies(h);
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
                                   .id = cd_memory_next_id() };
    h->n++;
    h->used += need;
    *out = (uintptr_t)h->base + at;
    rc = CUDA_SUCCESS;
out:
    pthread_mutex_unlock(&h->lock);
    return rc;
}

/* Lock held. Gives back the pages that lie wholly inside [off, off+size):
 * the boundary pages may be shared with neighbours. Punched out of the
 * file (a shared mapping's MADV_DONTNEED would keep the bytes); a forked
 * child's private view just drops its copies. */
static void give_back(struct heap *h, size_t off, size_t size)
{
    size_t start = (off + page_size - 1) & ~(page_size - 1);
    size_t end = (off + size) & ~(page_size - 1);
    if (end > start)
        madvise(h->rw + start, end - start, h->forked ? MADV_DONTNEED : MADV_REMOVE);
}

/* The export slot of the block at `off` (see the top of the file). */
static off_t slot_of(const struct heap *h, size_t off)
{
    return (off_t)(h->map_len + off / ALIGN * 8);
}

static void slot_write(struct heap *h, size_t off, unsigned long long id)
{
    if (pwrite(h->fd, &id, sizeof id, slot_of(h, off)) != (ssize_t)sizeof id)
        fprintf(stderr, "cudastandin: cannot write an IPC slot\n");
}

/* Whether some importer still holds [off, off+size) of the device's file. */
static bool imported(const struct heap *h, size_t off, size_t size)
{
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)off,
                        .l_len = (off_t)size };
    if (fcntl(h->fd, F_OFD_GETLK, &fl) != 0)
        return false;
    return fl.l_type != F_UNLCK;
}

/* Lock held. */
static void drop_block(struct heap *h, size_t i)
{
    struct block b = h->blocks[i];
    memmove(&h->blocks[i], &h->blocks[i + 1], (h->n - i - 1) * sizeof *h->blocks);
    h->n--;
    h->used -= b.size;
    if (b.zombie)
        h->zombies--;
    give_back(h, b.off, b.size);
}

/* Lock held. An exported block first leaves its slot, so that no import
 * starts on it; one that an importer still maps stays as a zombie. */
static void remove_block(struct heap *h, size_t i)
{
    struct block *b = &h->blocks[i];
    if (b->exported) {
        slot_write(h, b->off, 0);
        if (imported(h, b->off, b->asked)) {
            b->zombie = true;
            h->zombies++;
            return;
        }
    }
    drop_block(h, i);
}

/* Lock held. Drops the zombies no importer maps any more. */
static void reap_zombies(struct heap *h)
{
    for (size_t i = h->n; h->zombies && i-- > 0;)
        if (h->blocks[i].zombie && !imported(h, h->blocks[i].off, h->blocks[i].asked))
            drop_block(h, i);
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
    bool live = i >= 0 && h->blocks[i].off == off && !h->blocks[i].zombie;
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
    bool live = i >= 0 && h->blocks[i].off == off && !h->blocks[i].zombie;
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
        if (h->blocks[i].ctx == ctx && !h->blocks[i].zombie)
            remove_block(h, i);
    pthread_mutex_unlock(&h->lock);
    cd_ipc_drop_context(ctx);
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
    return cd_ipc_is_device(a, e);
}

unsigned long long cd_memory_next_id(void)
{
    return __atomic_add_fetch(&next_id, 1, __ATOMIC_RELAXED);
}

CUresult cd_memory_export(CUdeviceptr ptr, struct cd_export *out)
{
    int d = device_of(ptr);
    if (d < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct heap *h = &heaps[d];
    size_t off = ptr - (uintptr_t)h->base;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&h->lock);
    ptrdiff_t i = find_le(h, off);
    if (i >= 0 && !h->blocks[i].zombie && off - h->blocks[i].off < h->blocks[i].asked) {
        struct block *b = &h->blocks[i];
        if (h->fd < 0 || h->forked) {
            rc = CUDA_ERROR_NOT_SUPPORTED;
        } else {
            if (!b->exported)
                slot_write(h, b->off, b->id);
            b->exported = true;
            *out = (struct cd_export){ .dev = d, .fd = h->fd, .token = token, .off = b->off,
                                       .size = b->asked, .id = b->id,
                                       .slot = (size_t)slot_of(h, b->off) };
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&h->lock);
    return rc;
}

size_t cd_memory_page_size(void)
{
    return page_size;
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
    /* It waits for the device: a synchronizing call, refused where the
     * capture rules forbid one. */
    cd_capture_note_sync();
    if (cd_capture_refuses_unsafe_call())
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (cd_host_free_managed(dptr))
        return CUDA_SUCCESS;
    if (cd_mempool_owns(dptr))
        return CUDA_ERROR_INVALID_VALUE; /* stream-ordered memory: cuMemFreeAsync's */
    return cd_memory_free(dptr);
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
