/* The slab (slab.h): malloc'd blocks of SHIM_SLAB_BYTES, each a header,
 * then objects from the first 64-byte boundary after it, each object's
 * last word the address of its block (beyond the owner's bytes).
 *
 * Owns the blocks. Guarded by the owner's lock but for new and
 * free_blocks (malloc and free, outside it). Never looks inside an
 * object but at its first word while it is free and at its last. */
#include "slab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
    struct block *next; /* every block of the cache */
    size_t objects;     /* how many it holds */
    size_t free_count;  /* a sweep's count of its free objects, else 0 */
} block;

static block *block_of(const shim_slab_cache *c, const void *o)
{
    block *b;
    memcpy(&b, (const char *)o + c->stride - sizeof b, sizeof b);
    return b;
}

void *shim_slab_new(const shim_slab_cache *c)
{
    (void)c;
    return calloc(1, SHIM_SLAB_BYTES);
}

void shim_slab_add(shim_slab_cache *c, void *blk)
{
    block *b = blk;
    uintptr_t first = ((uintptr_t)(b + 1) + 63) & ~(uintptr_t)63;
    size_t n = ((uintptr_t)b + SHIM_SLAB_BYTES - first) / c->stride;
    b->next = c->blocks;
    b->objects = n;
    c->blocks = b;
    /* Pushed last first, so that the first object is taken first: a
     * block is used from its start. */
    for (size_t i = n; i-- > 0;) {
        char *o = (char *)first + i * c->stride;
        memcpy(o + c->stride - sizeof b, &b, sizeof b);
        shim_slab_push(c, o);
    }
    c->nobjs += n;
}

void *shim_slab_sweep(shim_slab_cache *c)
{
    for (void **o = c->free; o; o = *o)
        block_of(c, o)->free_count++;
    /* The objects of wholly free blocks off the list, in one pass. */
    for (void **at = &c->free; *at;) {
        void **o = *at;
        block *b = block_of(c, o);
        if (b->free_count == b->objects) {
            *at = *o;
            c->nfree--;
        } else {
            at = (void **)o;
        }
    }
    block *gone = NULL;
    for (block **at = (block **)&c->blocks; *at;) {
        block *b = *at;
        if (b->free_count == b->objects) {
            *at = b->next;
            c->nobjs -= b->objects;
            b->next = gone;
            gone = b;
        } else {
            b->free_count = 0;
            at = &b->next;
        }
    }
    c->sweep_at = 2 * c->nfree > 1024 ? 2 * c->nfree : 1024;
    return gone;
}

void shim_slab_free_blocks(void *list)
{
    for (block *b = list, *next; b; b = next) {
        next = b->next;
        free(b);
    }
}
