/* The slab (slab.c): host objects of one size for the shim's own records,
 * 64-byte aligned, carved from malloc'd blocks of SHIM_SLAB_BYTES, and
 * kept on one LIFO list of free objects for the next one. The objects sit
 * together, apart from the program's heap: a watched OpenCL create and
 * release pair reads one cache line of a node there, where a malloc'd
 * node among the runtime's own small chunks cost it a tenth of its time
 * (docs/opencl.md, "Cost"). The blocks are not aligned to their size
 * (blocks so aligned all start on the same cache sets): each object's
 * last word names its block. Blocks wholly free go back to the C library
 * in a sweep, due once the free objects pass 1,024, then twice what the
 * last sweep left (a sweep's cost, a walk of the free list, is so spread
 * over the pushes it follows), so that a program's peak is not kept.
 *
 * Guarded by: the owner's lock (passthrough.c's pt_mu) for everything but
 * shim_slab_new and shim_slab_free_blocks, which take no lock and are
 * called outside it (they are malloc and free).
 * Never: calls anything under the owner's lock. */
#ifndef SHIM_SLAB_H
#define SHIM_SLAB_H

#include <stdbool.h>
#include <stddef.h>

#pragma GCC visibility push(hidden)

#define SHIM_SLAB_BYTES 16384

typedef struct shim_slab_cache {
    size_t stride;     /* an object's bytes and its block's name, to 64 */
    void *free;        /* free objects: each one's first word links the next */
    size_t nfree;      /* on that list */
    size_t nobjs;      /* in every block, free or not */
    size_t sweep_at;   /* nfree past it: shim_slab_sweep is due */
    void *blocks;      /* every block, linked through its header */
} shim_slab_cache;

/* For objects of `size` bytes. */
#define SHIM_SLAB_CACHE_INIT(size) \
    {.stride = ((size) + sizeof(void *) + 63) & ~(size_t)63, .sweep_at = 1024}

/* A free object (its words as the last user left them, but the first,
 * which is the link), or NULL: none left (then shim_slab_new). Inline, as
 * push: every record's. */
static inline void *shim_slab_pop(shim_slab_cache *c)
{
    void **o = c->free;
    if (__builtin_expect(o != NULL, 1)) {
        c->free = *o;
        c->nfree--;
    }
    return o;
}

/* `o` free again. */
static inline void shim_slab_push(shim_slab_cache *c, void *o)
{
    *(void **)o = c->free;
    c->free = o;
    c->nfree++;
}

/* Whether a sweep is due (asked after a push, off the common path). */
static inline bool shim_slab_sweep_due(const shim_slab_cache *c)
{
    return c->nfree > c->sweep_at;
}

/* A new block for `c`, zeroed, outside the owner's lock (malloc); NULL
 * when out of host memory. Its objects are zero until first used. */
void *shim_slab_new(const shim_slab_cache *c);
/* The block's objects onto c's free list (the owner's lock held). */
void shim_slab_add(shim_slab_cache *c, void *block);
/* The blocks whose every object is free, with those objects, taken out of
 * `c` (the owner's lock held); a list to give to shim_slab_free_blocks
 * once the lock is let go. NULL: none. */
void *shim_slab_sweep(shim_slab_cache *c);
void shim_slab_free_blocks(void *list);

#pragma GCC visibility pop

#endif
