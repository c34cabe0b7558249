/* vmm: virtual memory management (cuMemAddressReserve/Free, cuMemCreate,
 * cuMemRelease, cuMemRetainAllocationHandle, cuMemMap, cuMemUnmap,
 * cuMemSetAccess, the granularity, and
 * POSIX file descriptor handles for export and import).
 *
 * A reservation is a real PROT_NONE mapping of the address space, so its
 * addresses are the process's and a host load or store through them
 * faults, mapped or not, as with device memory. A physical allocation
 * (cuMemCreate) is a memfd of its size, counted against its device's
 * memory (memory.c's cd_memory_charge: cuMemGetInfo sees it, and
 * cuMemAlloc finds less room); its bytes are a shared read-write mapping of
 * that memfd that only the stream workers' copies touch, like the heaps'.
 * Export hands out a duplicate of the memfd; import, in this process or
 * another, maps the same file: both processes see the same bytes. A
 * physical allocation lives while a reference of its handle (cuMemCreate's,
 * each cuMemRetainAllocationHandle's) is not released or a mapping uses it
 * (the driver's rule); the memory is given back when both are gone.
 * An imported one was charged in the exporting process only.
 *
 * Mapped ranges answer cd_memory_find (memory.c asks vmm_find for addresses
 * outside the heaps), so pointer queries and copies work on them; copies
 * need the access cuMemSetAccess granted for the copying context's device.
 *
 * One lock, `lock`, guards the lists; a leaf (memory.c's charge is taken
 * after it is released). Errors are the real driver's: an unknown handle,
 * a range that is not reserved, or an unaligned size is
 * CUDA_ERROR_INVALID_VALUE; a device out of memory CUDA_ERROR_OUT_OF_MEMORY;
 * a location that is no device CUDA_ERROR_INVALID_DEVICE. */
#include "internal.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The real driver's granularity on every GPU so far: 2 MiB. */
#define GRANULE ((size_t)2 << 20)

struct phys {
    struct phys *next;
    int fd;
    size_t size;
    CUdevice dev;
    int handle_types;
    bool charged;        /* counted against dev's memory (not an import) */
    unsigned refs;       /* handle references: cuMemCreate's, each retain's */
    unsigned maps;       /* live mappings using it */
    char *rw;            /* the bytes, for copies */
    unsigned long long id;
};

struct reservation {
    struct reservation *next;
    uintptr_t base;
    size_t size;
};

struct mapping {
    struct mapping *next;
    uintptr_t va;
    size_t size, offset;
    struct phys *p;
    unsigned long long access[CD_MAX_DEVICES]; /* CU_MEM_ACCESS_FLAGS_* per device */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct phys *physs;
static struct reservation *reservations;
static struct mapping *mappings;
static unsigned long long next_id = 1ull << 62; /* apart from the heaps' buffer ids */

/* Lock held. */
static struct phys *phys_of(CUmemGenericAllocationHandle h)
{
    for (struct phys *p = physs; p; p = p->next)
        if ((uintptr_t)p == h && p->refs)
            return p;
    return NULL;
}

static struct reservation *reservation_of(uintptr_t va, size_t size)
{
    for (struct reservation *r = reservations; r; r = r->next)
        if (va >= r->base && size <= r->size && va - r->base <= r->size - size)
            return r;
    return NULL;
}

static bool overlaps_mapping(uintptr_t va, size_t size)
{
    for (struct mapping *m = mappings; m; m = m->next)
        if (va < m->va + m->size && m->va < va + size)
            return true;
    return false;
}

/* The physical allocation is gone once released and unmapped: taken out of
 * the list (lock held); the caller frees it with phys_free. */
static bool phys_unlink_if_dead(struct phys *p)
{
    if (p->refs || p->maps)
        return false;
    for (struct phys **pp = &physs; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            return true;
        }
    return false;
}

static void phys_free(struct phys *p)
{
    munmap(p->rw, p->size);
    close(p->fd);
    if (p->charged)
        cd_memory_uncharge(p->dev, p->size);
    free(p);
}

static bool valid_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
           prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
           (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    CD_REQUIRE_INIT();
    if (!granularity || !valid_prop(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    *granularity = GRANULE;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    CD_REQUIRE_INIT();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (!ptr || size == 0 || size % page || flags != 0 || (alignment & (alignment - 1)) ||
        addr % page)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment < GRANULE)
        alignment = GRANULE;
    if (size > SIZE_MAX - alignment)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct reservation *r = malloc(sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    /* Over-reserve, then trim to the alignment (the hint is only a hint). */
    char *raw = mmap(addr ? (void *)(uintptr_t)addr : NULL, size + alignment, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        free(r);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t base = ((uintptr_t)raw + alignment - 1) & ~(uintptr_t)(alignment - 1);
    if (base > (uintptr_t)raw)
        munmap(raw, base - (uintptr_t)raw);
    uintptr_t end = (uintptr_t)raw + size + alignment;
    if (end > base + size)
        munmap((void *)(base + size), end - (base + size));
    *r = (struct reservation){.base = base, .size = size};
    pthread_mutex_lock(&lock);
    r->next = reservations;
    reservations = r;
    pthread_mutex_unlock(&lock);
    *ptr = base;
    return CUDA_SUCCESS;
}

/* Exactly a range reserved before, with nothing mapped in it any more. */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CD_REQUIRE_INIT();
    struct reservation *found = NULL;
    pthread_mutex_lock(&lock);
    for (struct reservation **rr = &reservations; *rr; rr = &(*rr)->next)
        if ((*rr)->base == ptr && (*rr)->size == size && !overlaps_mapping(ptr, size)) {
            found = *rr;
            *rr = found->next;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (!found)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)found->base, found->size);
    free(found);
    return CUDA_SUCCESS;
}

/* A physical allocation of `fd` (its bytes mapped for copies). */
static CUresult phys_new(int fd, size_t size, CUdevice dev, int types, bool charged,
                         CUmemGenericAllocationHandle *out)
{
    struct phys *p = calloc(1, sizeof *p);
    char *rw = p ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (rw == MAP_FAILED) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = (struct phys){.fd = fd, .size = size, .dev = dev, .handle_types = types,
                       .charged = charged, .rw = rw, .refs = 1};
    pthread_mutex_lock(&lock);
    p->id = next_id++;
    p->next = physs;
    physs = p;
    pthread_mutex_unlock(&lock);
    *out = (uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    CD_REQUIRE_INIT();
    if (!handle || !valid_prop(prop) || flags != 0 || size == 0 || size % GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    CUdevice dev = prop->location.id;
    if (!cd_device_valid(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (!cd_memory_charge(dev, size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    char name[32];
    snprintf(name, sizeof name, "cudastandin-vmm-%d", dev);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0)
            close(fd);
        cd_memory_uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = phys_new(fd, size, dev, prop->requestedHandleTypes, true, handle);
    if (rc) {
        close(fd);
        cd_memory_uncharge(dev, size);
    }
    return rc;
}

/* One reference of the handle goes; the memory stays while another or a
 * mapping uses it. */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CD_REQUIRE_INIT();
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(handle);
    bool dead = false;
    if (p) {
        p->refs--;
        dead = phys_unlink_if_dead(p);
    }
    pthread_mutex_unlock(&lock);
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (dead)
        phys_free(p);
    return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CD_REQUIRE_INIT();
    if (flags != 0 || size == 0 || ptr % GRANULE || size % GRANULE || offset % GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    struct mapping *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(handle);
    if (p && offset <= p->size && size <= p->size - offset && reservation_of(ptr, size) &&
        !overlaps_mapping(ptr, size)) {
        *m = (struct mapping){.va = ptr, .size = size, .offset = offset, .p = p};
        m->next = mappings;
        mappings = m;
        p->maps++;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    if (rc)
        free(m);
    return rc;
}

/* Every mapping in [ptr, ptr + size) goes, and the range must be mapped
 * whole mappings (no mapping cut in two). */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CD_REQUIRE_INIT();
    if (size == 0 || ptr % GRANULE || size % GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    struct mapping *gone = NULL;
    struct phys *dead = NULL;
    bool ok = true;
    size_t covered = 0;
    pthread_mutex_lock(&lock);
    for (struct mapping *m = mappings; m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size) {
            ok &= m->va >= ptr && m->va + m->size <= ptr + size;
            covered += m->size;
        }
    ok &= covered == size;
    for (struct mapping **mm = &mappings; ok && *mm;) {
        struct mapping *m = *mm;
        if (m->va >= ptr && m->va + m->size <= ptr + size) {
            *mm = m->next;
            m->next = gone;
            gone = m;
            m->p->maps--;
            if (phys_unlink_if_dead(m->p)) {
                m->p->next = dead;
                dead = m->p;
            }
        } else {
            mm = &m->next;
        }
    }
    pthread_mutex_unlock(&lock);
    while (gone) {
        struct mapping *m = gone;
        gone = m->next;
        free(m);
    }
    while (dead) {
        struct phys *p = dead;
        dead = p->next;
        phys_free(p);
    }
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The whole range must be mapped; each descriptor names a device. */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CD_REQUIRE_INIT();
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
             desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
             desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
            return CUDA_ERROR_INVALID_VALUE;
        if (!cd_device_valid(desc[i].location.id))
            return CUDA_ERROR_INVALID_DEVICE;
    }
    pthread_mutex_lock(&lock);
    size_t covered = 0;
    for (struct mapping *m = mappings; m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size) {
            uintptr_t a = m->va > ptr ? m->va : ptr;
            uintptr_t e = m->va + m->size < ptr + size ? m->va + m->size : ptr + size;
            covered += e - a;
        }
    bool ok = covered == size;
    for (struct mapping *m = mappings; ok && m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + size)
            for (size_t i = 0; i < count; i++)
                m->access[desc[i].location.id] = (unsigned)desc[i].flags;
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags)
{
    CD_REQUIRE_INIT();
    if (!shareableHandle || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(handle);
    int fd = p && (p->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                 ? fcntl(p->fd, F_DUPFD_CLOEXEC, 0) : -2;
    pthread_mutex_unlock(&lock);
    if (fd == -2)
        return CUDA_ERROR_INVALID_VALUE;
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

/* The device of an exported memfd: its name says it. */
static CUdevice device_of_fd(int fd)
{
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0)
        return -1;
    target[n] = '\0';
    const char *tag = strstr(target, "cudastandin-vmm-");
    return tag ? atoi(tag + strlen("cudastandin-vmm-")) : -1;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    CD_REQUIRE_INIT();
    int fd = (int)(intptr_t)osHandle;
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct stat st;
    CUdevice dev = device_of_fd(fd);
    if (fstat(fd, &st) != 0 || st.st_size <= 0 || (size_t)st.st_size % GRANULE || dev < 0 ||
        !cd_device_valid(dev))
        return CUDA_ERROR_INVALID_VALUE;
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = phys_new(mine, (size_t)st.st_size, dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                           false, handle);
    if (rc)
        close(mine);
    return rc;
}

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                CUmemGenericAllocationHandle handle)
{
    CD_REQUIRE_INIT();
    if (!prop)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct phys *p = phys_of(handle);
    if (p) {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->requestedHandleTypes = p->handle_types;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = p->dev;
    }
    pthread_mutex_unlock(&lock);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

bool cd_vmm_find(CUdeviceptr ptr, size_t len, struct cd_block *out)
{
    bool ok = false;
    pthread_mutex_lock(&lock);
    for (struct mapping *m = mappings; m && !ok; m = m->next)
        if (ptr >= m->va && ptr - m->va < m->size && len <= m->size - (ptr - m->va)) {
            out->dev = m->p->dev;
            out->base = m->va;
            out->size = m->size;
            out->ctx = NULL;
            out->id = m->p->id;
            out->rw = m->p->rw + m->offset + (ptr - m->va);
            ok = true;
        }
    pthread_mutex_unlock(&lock);
    return ok;
}

bool cd_vmm_accessible(CUdeviceptr ptr, size_t len, CUdevice dev)
{
    bool ok = true, any = false;
    pthread_mutex_lock(&lock);
    for (struct mapping *m = mappings; m; m = m->next)
        if (ptr < m->va + m->size && m->va < ptr + len) {
            any = true;
            ok &= dev >= 0 && dev < CD_MAX_DEVICES &&
                  m->access[dev] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
    pthread_mutex_unlock(&lock);
    return !any || ok;
}

/* The handle of the allocation mapped at addr, the same value that was
 * mapped, with one more reference (released by cuMemRelease): a released
 * handle that is still mapped is usable again. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CD_REQUIRE_INIT();
    if (!handle)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (struct mapping *m = mappings; m; m = m->next)
        if ((uintptr_t)addr >= m->va && (uintptr_t)addr - m->va < m->size) {
            m->p->refs++;
            *handle = (uintptr_t)m->p;
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&lock);
    return rc;
}
