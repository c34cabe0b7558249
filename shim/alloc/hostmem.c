/* Growable host arrays for the allocator's metadata (see hostmem.h).
 *
 * Owns nothing but the mappings it hands out; no lock (each array belongs
 * to a structure its owner's lock guards).
 * Never: allocates with malloc (a preloaded shim may sit under a program's
 * own malloc), or touches the pages it maps (resident memory is what the
 * caller writes). */
#include "hostmem.h"

#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>
#include <unistd.h>

/* Arrays from this size on are offered huge pages: at a million live
 * blocks the node array alone is 32 MiB, and random accesses to it with
 * 4 KiB pages miss the TLB as often as the cache. Below it, a huge page
 * would make a small program's metadata resident 2 MiB at a time. */
#define HUGE_FROM ((size_t)4 << 20)

static size_t page_size(void)
{
    return (size_t)sysconf(_SC_PAGESIZE); /* growth only: rare */
}

size_t shim_hostmem_size(size_t bytes)
{
    size_t ps = page_size();
    return (bytes + ps - 1) & ~(ps - 1);
}

void *shim_hostmem_grow(void *old, size_t old_bytes, size_t new_bytes)
{
    size_t ob = old ? shim_hostmem_size(old_bytes) : 0, nb = shim_hostmem_size(new_bytes);
    void *p;
    if (!old)
        p = mmap(NULL, nb, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    else if (nb <= ob)
        return old;
    else
        p = mremap(old, ob, nb, MREMAP_MAYMOVE);
    if (p == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (nb >= HUGE_FROM)
        (void)madvise(p, nb, MADV_HUGEPAGE); /* a hint: refused is fine */
#endif
    return p;
}

void shim_hostmem_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, shim_hostmem_size(bytes));
}

void *shim_hostmem_lines(size_t bytes)
{
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n);
    if (p)
        memset(p, 0, n);
    return p;
}
