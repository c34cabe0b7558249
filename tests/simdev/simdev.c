/* simdev: the simulated device runtime (see simdev.h for the contract).
 *
 * Owns: the device's two views of memory and its allocator. Device
 * addresses are an anonymous PROT_NONE reservation, so a host load or store
 * through a device pointer faults; the bytes live at the same offsets in a
 * second, private read-write mapping that only Memset/Memcpy touch. Both are
 * MAP_NORESERVE: nothing is committed until written, and a free gives whole
 * pages back (MADV_DONTNEED).
 *
 * Why not a shared memfd mapped twice: after fork() parent and child would
 * write the same pages and punch holes in each other's data, and a private
 * writable mapping of a memfd hole fills the file's page cache as well as
 * the private copy. Anonymous private memory gives the child a copy-on-write
 * snapshot, which is what lets a forked child keep using the device.
 *
 * The allocator keeps all its metadata in host memory (never inside device
 * memory): two treaps keyed by device offset, one of free extents (augmented
 * with the largest extent in each subtree, for first fit in O(log n)) and
 * one of live blocks (for exact frees and for range checks of interior
 * pointers). One mutex, `dev.lock`, guards both trees and the counters; it
 * is taken around fork() so the child inherits it unlocked. Bytes are moved
 * outside the lock. Nothing here ever dereferences a device address. */
#include "simdev.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SIMDEV_ALIGN ((size_t)256)
#define SIMDEV_DEFAULT_CAPACITY ((size_t)1 << 30)

typedef struct node {
    size_t off;        /* device offset of the extent */
    size_t size;       /* bytes (multiple of SIMDEV_ALIGN) */
    size_t asked;      /* live blocks: the size requested; range checks use it */
    size_t max;        /* largest size in this subtree (free tree) */
    uint32_t prio;
    struct node *l, *r;
} node;

static struct {
    pthread_once_t once;
    pthread_mutex_t lock;
    bool ok;           /* reservation succeeded */
    char *dev;         /* PROT_NONE view: the device addresses */
    char *rw;          /* read-write view at the same offsets */
    size_t capacity;   /* as configured: MemGetInfo's total */
    size_t arena;      /* allocatable bytes: capacity rounded down to 256 */
    size_t map_len;    /* mapping length: capacity rounded up to a page */
    size_t page;
    size_t used;       /* bytes in live blocks (rounded sizes) */
    node *free_t;      /* free extents */
    node *live_t;      /* live blocks */
    uint32_t seed;
} dev = { .once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER };

/* ---- treap ------------------------------------------------------------ */

static size_t max3(size_t a, size_t b, size_t c)
{
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

static void update(node *n)
{
    n->max = max3(n->size, n->l ? n->l->max : 0, n->r ? n->r->max : 0);
}

/* Nodes with off < key go to *a, the rest to *b. */
static void split(node *t, size_t key, node **a, node **b)
{
    if (!t) {
        *a = *b = NULL;
    } else if (t->off < key) {
        split(t->r, key, &t->r, b);
        update(t);
        *a = t;
    } else {
        split(t->l, key, a, &t->l);
        update(t);
        *b = t;
    }
}

/* Every key of a is below every key of b. */
static node *merge(node *a, node *b)
{
    if (!a)
        return b;
    if (!b)
        return a;
    if (a->prio > b->prio) {
        a->r = merge(a->r, b);
        update(a);
        return a;
    }
    b->l = merge(a, b->l);
    update(b);
    return b;
}

static uint32_t next_prio(void)
{
    uint32_t x = dev.seed;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    dev.seed = x;
    return x;
}

static void insert(node **root, node *n)
{
    node *a, *b;
    n->l = n->r = NULL;
    n->prio = next_prio();
    update(n);
    split(*root, n->off, &a, &b);
    *root = merge(merge(a, n), b);
}

/* Removes and returns the node at exactly `off`, or NULL. */
static node *erase(node **root, size_t off)
{
    node *a, *b, *m, *c;
    split(*root, off, &a, &b);
    split(b, off + 1, &m, &c);
    *root = merge(a, c);
    if (m) {
        m->l = m->r = NULL;
        update(m);
    }
    return m;
}

/* The node with the largest off <= key, or NULL. */
static node *find_le(node *t, size_t key)
{
    node *best = NULL;
    while (t) {
        if (t->off <= key) {
            best = t;
            t = t->r;
        } else {
            t = t->l;
        }
    }
    return best;
}

/* The node with the smallest off >= key, or NULL. */
static node *find_ge(node *t, size_t key)
{
    node *best = NULL;
    while (t) {
        if (t->off >= key) {
            best = t;
            t = t->l;
        } else {
            t = t->r;
        }
    }
    return best;
}

/* First fit: the lowest-addressed extent of at least `need` bytes. */
static node *first_fit(node *t, size_t need)
{
    while (t && t->max >= need) {
        if (t->l && t->l->max >= need)
            t = t->l;
        else if (t->size >= need)
            return t;
        else
            t = t->r;
    }
    return NULL;
}

/* ---- configuration and initialization --------------------------------- */

/* Bytes with an optional binary suffix (K, M, G, T; "KB"/"KiB" accepted).
 * Returns false on anything else, zero, or overflow. */
static bool parse_size(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'B' || end[1] == 'b'))
        end += 2;
    else if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0' || v == 0)
        return false;
    if (v > (unsigned long long)(SIZE_MAX >> shift))
        return false;
    *out = (size_t)v << shift;
    return true;
}

static void atfork_prepare(void) { pthread_mutex_lock(&dev.lock); }
static void atfork_release(void) { pthread_mutex_unlock(&dev.lock); }

static void init(void)
{
    const char *env = getenv("SIMDEV_MEMORY");
    size_t cap = SIMDEV_DEFAULT_CAPACITY;
    if (env && !parse_size(env, &cap)) {
        fprintf(stderr, "simdev: SIMDEV_MEMORY='%s' is not a size (bytes, optional K/M/G/T); "
                        "using the default 1G\n", env);
        cap = SIMDEV_DEFAULT_CAPACITY;
    }
    dev.page = (size_t)sysconf(_SC_PAGESIZE);
    dev.capacity = cap;
    dev.arena = cap & ~(SIMDEV_ALIGN - 1);
    dev.seed = 0x9e3779b9u;
    pthread_atfork(atfork_prepare, atfork_release, atfork_release);

    if (cap > SIZE_MAX - dev.page) {
        fprintf(stderr, "simdev: capacity %zu bytes is too large\n", cap);
        return;
    }
    dev.map_len = (cap + dev.page - 1) & ~(dev.page - 1);
    void *d = mmap(NULL, dev.map_len, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (d == MAP_FAILED) {
        fprintf(stderr, "simdev: cannot reserve %zu bytes of device addresses: %s\n",
                cap, strerror(errno));
        return;
    }
    void *w = mmap(NULL, dev.map_len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (w == MAP_FAILED) {
        fprintf(stderr, "simdev: cannot reserve %zu bytes of device memory: %s\n",
                cap, strerror(errno));
        munmap(d, dev.map_len);
        return;
    }
    dev.dev = d;
    dev.rw = w;
    if (dev.arena > 0) {
        node *n = calloc(1, sizeof *n);
        if (!n) {
            fprintf(stderr, "simdev: out of host memory at initialization\n");
            return;
        }
        n->off = 0;
        n->size = dev.arena;
        insert(&dev.free_t, n);
    }
    dev.ok = true;
}

static bool ready(void)
{
    pthread_once(&dev.once, init);
    return dev.ok;
}

/* Device offset of p if p lies in the arena. */
static bool device_offset(const void *p, size_t *off)
{
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)dev.dev;
    if (a < base || a - base >= dev.arena)
        return false;
    *off = a - base;
    return true;
}

/* [p, p+count) lies inside one live allocation (as requested, not rounded).
 * count > 0. */
static bool device_range(const void *p, size_t count, size_t *off)
{
    if (!device_offset(p, off))
        return false;
    pthread_mutex_lock(&dev.lock);
    node *b = find_le(dev.live_t, *off);
    bool inside = b && *off - b->off < b->asked && count <= b->asked - (*off - b->off);
    pthread_mutex_unlock(&dev.lock);
    return inside;
}

/* A host range must not touch the device view: that would fault. */
static bool host_range(const void *p, size_t count)
{
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)dev.dev;
    if (!p || a + count < a)
        return false;
    return a + count <= base || a >= base + dev.map_len;
}

/* ---- the API ---------------------------------------------------------- */

simdevError_t simdevMalloc(void **ptr, size_t size)
{
    if (!ptr)
        return simdevErrorInvalidValue;
    if (size == 0) {
        *ptr = NULL;
        return simdevSuccess;
    }
    if (!ready() || size > SIZE_MAX - (SIMDEV_ALIGN - 1))
        return simdevErrorMemoryAllocation;
    size_t need = (size + SIMDEV_ALIGN - 1) & ~(SIMDEV_ALIGN - 1);
    node *blk = calloc(1, sizeof *blk);
    if (!blk)
        return simdevErrorMemoryAllocation;

    pthread_mutex_lock(&dev.lock);
    node *f = first_fit(dev.free_t, need);
    if (!f) {
        pthread_mutex_unlock(&dev.lock);
        free(blk);
        return simdevErrorMemoryAllocation;
    }
    f = erase(&dev.free_t, f->off);
    blk->off = f->off;
    blk->size = need;
    blk->asked = size;
    if (f->size > need) {
        f->off += need;
        f->size -= need;
        insert(&dev.free_t, f);
        f = NULL;
    }
    insert(&dev.live_t, blk);
    dev.used += need;
    *ptr = dev.dev + blk->off;
    pthread_mutex_unlock(&dev.lock);

    free(f);
    return simdevSuccess;
}

simdevError_t simdevFree(void *ptr)
{
    if (!ptr)
        return simdevSuccess;
    size_t off;
    if (!ready() || !device_offset(ptr, &off))
        return simdevErrorInvalidValue;

    pthread_mutex_lock(&dev.lock);
    node *n = erase(&dev.live_t, off);
    if (!n) {
        pthread_mutex_unlock(&dev.lock);
        return simdevErrorInvalidValue;
    }
    dev.used -= n->size;
    size_t lo = n->off, hi = n->off + n->size;
    node *prev = find_le(dev.free_t, lo);
    node *next = find_ge(dev.free_t, hi);
    node *gone[2] = { NULL, NULL };
    if (prev && prev->off + prev->size == lo) {
        gone[0] = erase(&dev.free_t, prev->off);
        lo = gone[0]->off;
    }
    if (next && next->off == hi) {
        gone[1] = erase(&dev.free_t, next->off);
        hi += gone[1]->size;
    }
    /* Give back the pages of the freed block, and its boundary pages too
     * where the neighbours are free. */
    size_t pm = dev.page - 1;
    size_t start = n->off & ~pm;
    if (start < lo)
        start = (n->off + pm) & ~pm;
    size_t end = (n->off + n->size + pm) & ~pm;
    if (end > hi)
        end = (n->off + n->size) & ~pm;
    if (end > start)
        madvise(dev.rw + start, end - start, MADV_DONTNEED);
    n->off = lo;
    n->size = hi - lo;
    n->asked = 0;
    insert(&dev.free_t, n);
    pthread_mutex_unlock(&dev.lock);

    free(gone[0]);
    free(gone[1]);
    return simdevSuccess;
}

simdevError_t simdevMemGetInfo(size_t *free_bytes, size_t *total)
{
    if (!ready()) {
        if (free_bytes)
            *free_bytes = 0;
        if (total)
            *total = 0;
        return simdevErrorMemoryAllocation;
    }
    pthread_mutex_lock(&dev.lock);
    size_t used = dev.used;
    pthread_mutex_unlock(&dev.lock);
    if (free_bytes)
        *free_bytes = dev.capacity - used;
    if (total)
        *total = dev.capacity;
    return simdevSuccess;
}

simdevError_t simdevMemset(void *dst, int value, size_t count)
{
    if (count == 0)
        return simdevSuccess;
    size_t off;
    if (!ready() || !device_range(dst, count, &off))
        return simdevErrorInvalidValue;
    memset(dev.rw + off, value, count);
    return simdevSuccess;
}

simdevError_t simdevMemcpy(void *dst, const void *src, size_t count, int kind)
{
    if (kind < simdevMemcpyHostToDevice || kind > simdevMemcpyDeviceToDevice)
        return simdevErrorInvalidValue;
    if (count == 0)
        return simdevSuccess;
    if (!ready())
        return simdevErrorInvalidValue;
    size_t doff, soff;
    switch (kind) {
    case simdevMemcpyHostToDevice:
        if (!host_range(src, count) || !device_range(dst, count, &doff))
            return simdevErrorInvalidValue;
        memcpy(dev.rw + doff, src, count);
        break;
    case simdevMemcpyDeviceToHost:
        if (!host_range(dst, count) || !device_range(src, count, &soff))
            return simdevErrorInvalidValue;
        memcpy(dst, dev.rw + soff, count);
        break;
    default:
        if (!device_range(dst, count, &doff) || !device_range(src, count, &soff))
            return simdevErrorInvalidValue;
        memmove(dev.rw + doff, dev.rw + soff, count);
        break;
    }
    return simdevSuccess;
}

const char *simdevGetErrorString(simdevError_t err)
{
    switch (err) {
    case simdevSuccess: return "no error";
    case simdevErrorInvalidValue: return "invalid argument";
    case simdevErrorMemoryAllocation: return "out of memory";
    default: return "unrecognized error code";
    }
}
