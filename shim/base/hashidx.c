/* One open-addressing index (see hashidx.h): ids keyed by a 64-bit hash,
 * linear probing, load factor <= 1/2, grown by doubling.
 *
 * Owns: its tables (the current one and, in lock-free mode, the superseded
 * ones, chained). Guarded by: the owner's writer lock for reserve, insert
 * and destroy; find takes no lock. Never: frees a table a lock-free reader
 * may hold, or calls the equality function from the writer's growth (only
 * hash_of, on entries already published).
 */
#include "hashidx.h"

#include <stdlib.h>

struct shim_hashidx_table {
    size_t mask;
    shim_hashidx_table *retired;   /* the table this one replaced */
    _Atomic uint32_t slot[];       /* 0 = empty */
};

#define FIRST_CAP 256

static void put(shim_hashidx_table *t, uint64_t hash, uint32_t id)
{
    size_t i = hash & t->mask;
    while (atomic_load_explicit(&t->slot[i], memory_order_relaxed) != 0)
        i = (i + 1) & t->mask;
    /* Release: a reader that sees the id sees the entry published before. */
    atomic_store_explicit(&t->slot[i], id, memory_order_release);
}

uint32_t shim_hashidx_find(const shim_hashidx *x, uint64_t hash, const void *key)
{
    const shim_hashidx_table *t = atomic_load_explicit(&x->cur, memory_order_acquire);
    if (!t)
        return 0;
    for (size_t i = hash & t->mask;; i = (i + 1) & t->mask) {
        uint32_t id = atomic_load_explicit(&t->slot[i], memory_order_acquire);
        if (id == 0)
            return 0;
        if (x->eq(x->ctx, id, hash, key))
            return id;
    }
}

bool shim_hashidx_reserve(shim_hashidx *x, size_t n)
{
    shim_hashidx_table *t = atomic_load_explicit(&x->cur, memory_order_relaxed);
    size_t need = x->count + n;
    if (t && need * 2 <= t->mask + 1)
        return true;
    size_t cap = t ? t->mask + 1 : FIRST_CAP;
    while (need * 2 > cap)
        cap *= 2;
    shim_hashidx_table *nt = calloc(1, sizeof *nt + cap * sizeof nt->slot[0]);
    if (!nt)
        return false;
    nt->mask = cap - 1;
    if (t) {
        for (size_t i = 0; i <= t->mask; i++) {
            uint32_t id = atomic_load_explicit(&t->slot[i], memory_order_relaxed);
            if (id)
                put(nt, x->hash_of(x->ctx, id), id);
        }
        if (x->lockfree)
            nt->retired = t;
        else
            free(t);
    }
    atomic_store_explicit(&x->cur, nt, memory_order_release);
    return true;
}

void shim_hashidx_insert(shim_hashidx *x, uint64_t hash, uint32_t id)
{
    put(atomic_load_explicit(&x->cur, memory_order_relaxed), hash, id);
    x->count++;
}

size_t shim_hashidx_count(const shim_hashidx *x)
{
    return x->count;
}

void shim_hashidx_destroy(shim_hashidx *x)
{
    shim_hashidx_table *t = atomic_load_explicit(&x->cur, memory_order_relaxed);
    while (t) {
        shim_hashidx_table *r = t->retired;
        free(t);
        t = r;
    }
    atomic_store_explicit(&x->cur, NULL, memory_order_relaxed);
    x->count = 0;
}
