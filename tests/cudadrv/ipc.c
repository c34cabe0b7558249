/* ipc: IPC memory handles across processes (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle(_v2), cuIpcCloseMemHandle), as the driver documents
 * them:
 * - a handle names the whole allocation that holds the pointer (any
 *   address inside it), and opening it maps that allocation at a new
 *   device address of the importer, its base (offsets are the program's
 *   business: it sends ptr - base alongside);
 * - a handle cannot be opened in the process that made it
 *   (CUDA_ERROR_INVALID_CONTEXT, what the driver answers);
 * - opening one handle again in the same context returns the same address
 *   and counts; each open needs its close, and the last close unmaps;
 * - the only flag is CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (1); a handle of
 *   another device than the current context's is refused (the stand-in
 *   has no peer access between devices): CUDA_ERROR_INVALID_DEVICE, or
 *   with the flag CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
 * - the exporter freeing the allocation while an importer has it open is
 *   undefined by the documentation; here the importer keeps reading the
 *   bytes it had (memory.c keeps them as a zombie) and they never go to
 *   another owner; an allocation freed before the open is refused
 *   (CUDA_ERROR_INVALID_HANDLE); an exporter that is gone gives
 *   CUDA_ERROR_MAP_FAILED;
 * - the importer's context teardown closes its imports.
 *
 * The bytes: the exporter's device memory is a memfd per device
 * (memory.c). The handle holds the exporter's pid, the descriptor number,
 * the process's random token (in the file's name: a reused pid never
 * passes), the allocation's offset, size, slot and buffer id. The
 * importer opens /proc/<pid>/fd/<fd> (same user: what a real driver's
 * IPC needs too), takes an open-file-description read lock on the
 * allocation's range (the exporter sees it: memory.c), checks the slot
 * still holds the id, and maps the pages. The importer's device address
 * is a PROT_NONE reservation of its own, so the program cannot touch it;
 * copies reach the bytes through the driver (cd_memory_find falls back to
 * cd_ipc_find), and only [base, base + size): a read past the end fails
 * as for any allocation.
 *
 * Guarded by: `lock`, the list of opened handles. Taken after a device's
 * allocator lock is released, never with it (cd_memory_find asks the
 * devices first). Never: touches the exporter's metadata (it has none
 * here but the slot), or hands out the exporter's address. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 1u

#define IPC_TAG "cdipc1"

struct handle {
    char tag[8];
    int32_t pid;
    int32_t fd;
    int32_t dev;
    uint32_t pad;
    unsigned long long token;
    unsigned long long off;
    unsigned long long size;
    unsigned long long slot;
    unsigned long long id;
};
_Static_assert(sizeof(struct handle) <= sizeof(CUipcMemHandle), "IPC handle fits in 64 bytes");

struct import {
    CUcontext ctx;
    CUdevice dev;
    CUdeviceptr base;     /* the importer's device address */
    size_t size;
    char *reserve;        /* PROT_NONE, reserve_len bytes at base */
    size_t reserve_len;
    char *map;            /* the exporter's pages, map_len bytes */
    size_t map_len;
    size_t delta;         /* where the allocation starts in map */
    int fd;               /* holds the read lock */
    unsigned refs;
    unsigned long long buffer_id;
    int32_t pid;          /* which handle: pid, token, id */
    unsigned long long token, exporter_id;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct import *imports;
static size_t nimports, cap;

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CD_REQUIRE_INIT();
    if (!cd_context_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    struct cd_export e;
    CUresult rc = cd_memory_export(dptr, &e);
    if (rc)
        return rc; /* an opened handle's range cannot be exported again either */
    struct handle h;
    memset(&h, 0, sizeof h);
    memcpy(h.tag, IPC_TAG, sizeof IPC_TAG);
    h.pid = (int32_t)getpid();
    h.fd = e.fd;
    h.dev = e.dev;
    h.token = e.token;
    h.off = e.off;
    h.size = e.size;
    h.slot = e.slot;
    h.id = e.id;
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &h, sizeof h);
    return CUDA_SUCCESS;
}

/* Opens the exporter's file, checking it is the one the handle names. */
static int open_exporter(const struct handle *h)
{
    char path[64], want[64], got[128];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
    snprintf(want, sizeof want, "/memfd:cudastandin-%016llx-%d", h->token, (int)h->dev);
    ssize_t n = readlink(path, got, sizeof got - 1);
    if (n < 0)
        return -1;
    got[n] = '\0';
    if (strncmp(got, want, strlen(want)) != 0)
        return -1;
    return open(path, O_RDWR | O_CLOEXEC);
}

/* Lock not held: maps the handle's allocation into *im (fd, lock, map,
 * reservation), or answers why not. */
static CUresult map_import(const struct handle *h, struct import *im)
{
    int fd = open_exporter(h);
    if (fd < 0)
        return CUDA_ERROR_MAP_FAILED;
    /* The lock first, then the slot: the exporter clears the slot before
     * it looks for locks (memory.c), so either it sees ours or we see its
     * free. */
    struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = (off_t)h->off,
                        .l_len = (off_t)h->size };
    unsigned long long id = 0;
    if (fcntl(fd, F_OFD_SETLK, &fl) != 0 ||
        pread(fd, &id, sizeof id, (off_t)h->slot) != (ssize_t)sizeof id || id != h->id) {
        close(fd);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    size_t page = cd_memory_page_size();
    size_t start = h->off & ~(page - 1);
    size_t delta = h->off - start;
    size_t map_len = (delta + h->size + page - 1) & ~(page - 1);
    size_t reserve_len = (h->size + page - 1) & ~(page - 1);
    void *map = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)start);
    void *res = mmap(NULL, reserve_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
    if (map == MAP_FAILED || res == MAP_FAILED) {
        if (map != MAP_FAILED)
            munmap(map, map_len);
        if (res != MAP_FAILED)
            munmap(res, reserve_len);
        close(fd);
        return CUDA_ERROR_MAP_FAILED;
    }
    im->fd = fd;
    im->map = map;
    im->map_len = map_len;
    im->delta = delta;
    im->reserve = res;
    im->reserve_len = reserve_len;
    im->base = (uintptr_t)res;
    im->size = h->size;
    return CUDA_SUCCESS;
}

static void unmap_import(struct import *im)
{
    munmap(im->map, im->map_len);
    munmap(im->reserve, im->reserve_len);
    close(im->fd); /* releases the read lock */
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!pdptr || (Flags & ~CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    struct handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (memcmp(h.tag, IPC_TAG, sizeof IPC_TAG) != 0 || h.size == 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (h.pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the driver's answer in the exporting process */
    if (h.dev != cd_context_device(ctx))
        return Flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS ? CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
                                                          : CUDA_ERROR_INVALID_DEVICE;

    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nimports; i++) {
        struct import *im = &imports[i];
        if (im->ctx == ctx && im->pid == h.pid && im->token == h.token && im->exporter_id == h.id) {
            im->refs++;
            *pdptr = im->base;
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&lock);

    struct import im = { .ctx = ctx, .dev = h.dev, .refs = 1, .pid = h.pid, .token = h.token,
                         .exporter_id = h.id };
    if ((rc = map_import(&h, &im)))
        return rc;
    im.buffer_id = cd_memory_next_id();
    pthread_mutex_lock(&lock);
    if (nimports == cap) {
        size_t ncap = cap ? 2 * cap : 16;
        struct import *n = realloc(imports, ncap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&lock);
            unmap_import(&im);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        imports = n;
        cap = ncap;
    }
    imports[nimports++] = im;
    pthread_mutex_unlock(&lock);
    *pdptr = im.base;
    return CUDA_SUCCESS;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    struct import gone;
    bool unmap = false;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nimports; i++) {
        if (imports[i].base == dptr) {
            rc = CUDA_SUCCESS;
            if (--imports[i].refs == 0) {
                gone = imports[i];
                imports[i] = imports[--nimports];
                unmap = true;
            }
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    if (unmap) {
        /* Work queued on the range may still read it: the device first. */
        cd_device_synchronize(gone.dev);
        unmap_import(&gone);
    }
    return rc;
}

bool cd_ipc_find(CUdeviceptr ptr, size_t len, struct cd_block *out)
{
    bool ok = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nimports; i++) {
        const struct import *im = &imports[i];
        size_t in = ptr - im->base;
        if (ptr >= im->base && in < im->size && len <= im->size - in) {
            *out = (struct cd_block){ .dev = im->dev, .base = im->base, .size = im->size,
                                      .ctx = im->ctx, .rw = im->map + im->delta + in,
                                      .id = im->buffer_id };
            ok = true;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return ok;
}

bool cd_ipc_is_device(uintptr_t a, uintptr_t e)
{
    bool hit = false;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < nimports && !hit; i++) {
        uintptr_t b = (uintptr_t)imports[i].reserve;
        hit = a < b + imports[i].reserve_len && e > b;
    }
    pthread_mutex_unlock(&lock);
    return hit;
}

void cd_ipc_drop_context(CUcontext ctx)
{
    for (;;) {
        struct import gone;
        bool found = false;
        pthread_mutex_lock(&lock);
        for (size_t i = 0; i < nimports; i++) {
            if (imports[i].ctx == ctx) {
                gone = imports[i];
                imports[i] = imports[--nimports];
                found = true;
                break;
            }
        }
        pthread_mutex_unlock(&lock);
        if (!found)
            return;
        unmap_import(&gone);
    }
}
