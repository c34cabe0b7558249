/* Live allocations: device pointer -> arena node id.
 *
 * Owns: a power-of-two array of 8-byte slots {tag, id}, open addressing
 * with linear probing (eight slots to a cache line). The tag is the top 32 bits of the pointer's
 * Fibonacci hash: the slot index is its top bits, so backward-shift
 * deletion finds each entry's home without looking at its key, and a
 * probe asks for a candidate's address (the owner's key function: the
 * arena node, which a free touches next anyway) only when the tags agree.
 * This replaces the earlier 40-byte records keyed by the pointer itself:
 * a free touches one slot line and the node, not a record line, a node
 * line and a second probe line; and the table costs 8 bytes a slot.
 * Deletion shifts the following run back instead of leaving tombstones,
 * so probe lengths never degrade. The load factor stays at or under 3/4.
 * Guarded by: the owner's allocator lock; nothing here locks. The only
 * reader without it is shim_table_prefetch, through two atomic hints.
 * Never: dereferences a key (keys are device addresses).
 * Locks, their order and fork: docs/locking.md.
 */
#include "table.h"
#include "hostmem.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    uint32_t tag;
    uint32_t id;                   /* SHIM_TABLE_NONE when empty */
} slot;

struct shim_table {
    slot *slots;
    size_t mask;                   /* capacity - 1 */
    unsigned bits;                 /* log2(capacity), <= 32 */
    size_t count;
    shim_table_key_fn key;
    const void *ctx;
    /* For shim_table_prefetch only, which runs without the lock. */
    _Atomic(slot *) hint_slots;
    _Atomic unsigned hint_bits;
};

/* Fibonacci hashing: multiply by 2^64/phi and keep the top bits. Device
 * pointers are aligned (256 bytes and more), so their low bits carry
 * nothing; the product's top bits depend on every bit above them. */
static inline uint32_t tag_of(uintptr_t p)
{
    return (uint32_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> 32);
}

static inline size_t home_of(uint32_t tag, unsigned bits)
{
    return (size_t)(tag >> (32 - bits));
}

static slot *slots_new(size_t cap)
{
    slot *s = shim_hostmem_grow(NULL, 0, cap * sizeof *s);
    if (s)
        memset(s, 0xff, cap * sizeof *s); /* id = SHIM_TABLE_NONE */
    return s;
}

shim_table *shim_table_create(size_t initial_capacity, shim_table_key_fn key, const void *ctx)
{
    if (!key)
        return NULL;
    shim_table *t = shim_hostmem_lines(sizeof *t);
    if (!t)
        return NULL;
    unsigned bits = 4;
    while (((size_t)1 << bits) * 3 / 4 < initial_capacity && bits < 32)
        bits++;
    t->slots = slots_new((size_t)1 << bits);
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->bits = bits;
    t->mask = ((size_t)1 << bits) - 1;
    t->key = key;
    t->ctx = ctx;
    atomic_store_explicit(&t->hint_slots, t->slots, memory_order_relaxed);
    atomic_store_explicit(&t->hint_bits, bits, memory_order_relaxed);
    return t;
}

void shim_table_destroy(shim_table *t)
{
    if (!t)
        return;
    shim_hostmem_free(t->slots, (t->mask + 1) * sizeof *t->slots);
    free(t);
}

static int rehash(shim_table *t, unsigned bits)
{
    if (bits > 32)
        return -1;
    size_t cap = (size_t)1 << bits, mask = cap - 1;
    slot *ns = slots_new(cap);
    if (!ns)
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i].id == SHIM_TABLE_NONE)
            continue;
        size_t j = home_of(t->slots[i].tag, bits);
        while (ns[j].id != SHIM_TABLE_NONE)
            j = (j + 1) & mask;
        ns[j] = t->slots[i];
    }
    shim_hostmem_free(t->slots, (t->mask + 1) * sizeof *t->slots);
    t->slots = ns;
    t->mask = mask;
    t->bits = bits;
    atomic_store_explicit(&t->hint_slots, ns, memory_order_relaxed);
    atomic_store_explicit(&t->hint_bits, bits, memory_order_relaxed);
    return 0;
}

/* The slot holding `ptr`, or SIZE_MAX. */
static size_t lookup(const shim_table *t, uintptr_t ptr)
{
    if (ptr == 0)
        return SIZE_MAX;
    uint32_t tag = tag_of(ptr);
    for (size_t i = home_of(tag, t->bits);; i = (i + 1) & t->mask) {
        const slot *s = &t->slots[i];
        if (s->id == SHIM_TABLE_NONE)
            return SIZE_MAX;
        if (s->tag == tag && t->key(t->ctx, s->id) == ptr)
            return i;
    }
}

int shim_table_insert(shim_table *t, uintptr_t ptr, uint32_t id)
{
    if (ptr == 0 || id == SHIM_TABLE_NONE)
        return -1;
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX) {
        if ((t->count + 1) * 4 > (t->mask + 1) * 3 && rehash(t, t->bits + 1) != 0)
            return -1;
        uint32_t tag = tag_of(ptr);
        for (i = home_of(tag, t->bits); t->slots[i].id != SHIM_TABLE_NONE; i = (i + 1) & t->mask)
            ;
        t->slots[i].tag = tag;
        t->count++;
    }
    t->slots[i].id = id;
    return 0;
}

/* Stores a new entry; there is room (the load was checked). */
static inline void add_entry(shim_table *t, uintptr_t ptr, uint32_t id)
{
    uint32_t tag = tag_of(ptr);
    size_t i = home_of(tag, t->bits);
    while (t->slots[i].id != SHIM_TABLE_NONE)
        i = (i + 1) & t->mask;
    t->slots[i] = (slot){.tag = tag, .id = id};
    t->count++;
}

/* shim_table_add when the table must grow first (or the call is bad): out
 * of line and reached by a tail call, so that the common call saves no
 * registers for it. */
__attribute__((noinline)) static int add_grow(shim_table *t, uintptr_t ptr, uint32_t id)
{
    if (ptr == 0 || id == SHIM_TABLE_NONE)
        return -1;
    if ((t->count + 1) * 4 > (t->mask + 1) * 3 && rehash(t, t->bits + 1) != 0)
        return -1;
    add_entry(t, ptr, id);
    return 0;
}

int shim_table_add(shim_table *t, uintptr_t ptr, uint32_t id)
{
    if (ptr == 0 || id == SHIM_TABLE_NONE || (t->count + 1) * 4 > (t->mask + 1) * 3)
        return add_grow(t, ptr, id);
    add_entry(t, ptr, id);
    return 0;
}

uint32_t shim_table_remove(shim_table *t, uintptr_t ptr)
{
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX)
        return SHIM_TABLE_NONE;
    uint32_t id = t->slots[i].id;
    /* Backward shift: move each later entry of the run into the hole when
     * the hole lies on its probe path (between its home slot and it). */
    size_t hole = i;
    for (size_t j = (i + 1) & t->mask; t->slots[j].id != SHIM_TABLE_NONE; j = (j + 1) & t->mask) {
        size_t home = home_of(t->slots[j].tag, t->bits);
        if (((j - home) & t->mask) >= ((j - hole) & t->mask)) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    t->slots[hole].id = SHIM_TABLE_NONE;
    t->count--;
    return id;
}

uint32_t shim_table_find(const shim_table *t, uintptr_t ptr)
{
    size_t i = lookup(t, ptr);
    return i == SIZE_MAX ? SHIM_TABLE_NONE : t->slots[i].id;
}

size_t shim_table_count(const shim_table *t)
{
    return t->count;
}

void shim_table_foreach(const shim_table *t, void (*fn)(uintptr_t ptr, uint32_t id, void *user),
                        void *user)
{
    for (size_t i = 0; i <= t->mask; i++) {
        uint32_t id = t->slots[i].id;
        if (id != SHIM_TABLE_NONE)
            fn(t->key(t->ctx, id), id, user);
    }
}

size_t shim_table_meta_bytes(const shim_table *t)
{
    return sizeof *t + shim_hostmem_size((t->mask + 1) * sizeof *t->slots);
}

void shim_table_prefetch(const shim_table *t, uintptr_t ptr)
{
    uintptr_t s = (uintptr_t)atomic_load_explicit(&t->hint_slots, memory_order_relaxed);
    unsigned bits = atomic_load_explicit(&t->hint_bits, memory_order_relaxed);
    /* Integer arithmetic: with a stale pair the address may lie outside
     * any array, which a prefetch tolerates and C pointers do not. */
    __builtin_prefetch((const void *)(s + home_of(tag_of(ptr), bits) * sizeof(slot)));
}
