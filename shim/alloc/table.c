/* Live allocations: device pointer -> record.
 *
 * Owns: one power-of-two array of records, open addressing with linear
 * probing; a slot is empty when its ptr is 0. Deletion shifts the following
 * run back instead of leaving tombstones, so probe lengths never degrade.
 * The load factor stays at or under 1/2 (grow by rehash at insert).
 * Guarded by: the owner's allocator lock; nothing here locks.
 * Never: dereferences a key (keys are device addresses).
 */
#include "table.h"

#include <stdlib.h>

struct shim_table {
    shim_record *slots;
    size_t mask;                   /* capacity - 1 */
    unsigned shift;                /* 64 - log2(capacity) */
    size_t count;
};

/* Fibonacci hashing: multiply by 2^64/phi and keep the top bits. Device
 * pointers are aligned (256 bytes and more), so their low bits carry
 * nothing; the product's top bits depend on every bit above them. */
static inline size_t slot_of(const shim_table *t, uintptr_t p)
{
    return (size_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> t->shift);
}

static size_t pow2_ceil(size_t x)
{
    size_t c = 16;
    while (c < x)
        c <<= 1;
    return c;
}

shim_table *shim_table_create(size_t initial_capacity)
{
    shim_table *t = malloc(sizeof *t);
    if (!t)
        return NULL;
    size_t cap = pow2_ceil(initial_capacity * 2);
    t->slots = calloc(cap, sizeof *t->slots);
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->mask = cap - 1;
    t->shift = 64u - (unsigned)__builtin_ctzll(cap);
    t->count = 0;
    return t;
}

void shim_table_destroy(shim_table *t)
{
    if (!t)
        return;
    free(t->slots);
    free(t);
}

static int rehash(shim_table *t, size_t cap)
{
    shim_record *ns = calloc(cap, sizeof *ns);
    if (!ns)
        return -1;
    size_t mask = cap - 1;
    unsigned shift = 64u - (unsigned)__builtin_ctzll(cap);
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].ptr == 0)
            continue;
        size_t j = (size_t)(((uint64_t)t->slots[i].ptr * 0x9e3779b97f4a7c15ull) >> shift);
        while (ns[j].ptr != 0)
            j = (j + 1) & mask;
        ns[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = ns;
    t->mask = mask;
    t->shift = shift;
    return 0;
}

int shim_table_insert(shim_table *t, const shim_record *rec)
{
    if (rec->ptr == 0)
        return -1;
    size_t i = slot_of(t, rec->ptr);
    for (;; i = (i + 1) & t->mask) {
        if (t->slots[i].ptr == rec->ptr) {
            t->slots[i] = *rec;
            return 0;
        }
        if (t->slots[i].ptr == 0)
            break;
    }
    if ((t->count + 1) * 2 > t->mask + 1) {
        if (rehash(t, (t->mask + 1) * 2) != 0)
            return -1;
        i = slot_of(t, rec->ptr);
        while (t->slots[i].ptr != 0)
            i = (i + 1) & t->mask;
    }
    t->slots[i] = *rec;
    t->count++;
    return 0;
}

static size_t lookup(const shim_table *t, uintptr_t ptr)
{
    if (ptr == 0)
        return SIZE_MAX;
    for (size_t i = slot_of(t, ptr);; i = (i + 1) & t->mask) {
        if (t->slots[i].ptr == ptr)
            return i;
        if (t->slots[i].ptr == 0)
            return SIZE_MAX;
    }
}

bool shim_table_remove(shim_table *t, uintptr_t ptr, shim_record *out)
{
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX)
        return false;
    if (out)
        *out = t->slots[i];
    /* Backward shift: move each later entry of the run into the hole when
     * the hole lies on its probe path (between its home slot and it). */
    size_t hole = i;
    for (size_t j = (i + 1) & t->mask; t->slots[j].ptr != 0; j = (j + 1) & t->mask) {
        size_t home = slot_of(t, t->slots[j].ptr);
        if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole].ptr = 0;
    t->count--;
    return true;
}

const shim_record *shim_table_find(const shim_table *t, uintptr_t ptr)
{
    size_t i = lookup(t, ptr);
    return i == SIZE_MAX ? NULL : &t->slots[i];
}

size_t shim_table_count(const shim_table *t)
{
    return t->count;
}

void shim_table_foreach(const shim_table *t, void (*fn)(const shim_record *, void *), void *user)
{
    for (size_t i = 0; i <= t->mask; i++)
        if (t->slots[i].ptr != 0)
            fn(&t->slots[i], user);
}
