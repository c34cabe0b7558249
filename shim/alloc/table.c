/* Live allocations: device pointer -> arena node id, plus each live
 * block's leak-hunting fields by node id.
 *
 * Owns: an array of 8-byte slots {tag, id}, open addressing with linear
 * probing (eight slots to a cache line), and an array of fields (the
 * sequence number) indexed by node id. The tag is the top 32 bits of the
 * pointer's Fibonacci hash; an entry's home slot is tag * capacity / 2^32
 * (a multiply and a shift, any capacity), so backward-shift deletion finds
 * each entry's home without looking at its key, and a
 * probe asks for a candidate's address (the owner's key function: the
 * arena node, which a free touches next anyway) only when the tags agree.
 * This replaces the earlier 40-byte records keyed by the pointer itself:
 * a free touches one slot line and the node, not a record line, a node
 * line and a second probe line; and the table costs 8 bytes a slot.
 * Entries keep Robin Hood order (see place()), so searches stop early and
 * deletion shifts back only the entries displaced from their home, without
 * tombstones: probe lengths never degrade. The load factor stays at or under 3/4,
 * and the capacity grows by half rather than doubling: at a million live
 * blocks that is 1.35M slots (11 bytes a live block) instead of 2M
 * (17 bytes), which is what brings the host metadata under 64 bytes a
 * block (docs/allocator.md); the longer probes at loads near 3/4 stay
 * within one or two lines of eight slots.
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
    size_t cap;                    /* slots, <= 2^32 */
    size_t count;
    shim_live_fields *fields;      /* by node id */
    size_t fields_cap;
    shim_table_key_fn key;
    const void *ctx;
    /* For shim_table_prefetch only, which runs without the lock. */
    _Atomic(slot *) hint_slots;
    _Atomic size_t hint_cap;
};

#define CAP_MIN 16
#define CAP_MAX ((size_t)1 << 32)

/* Fibonacci hashing: multiply by 2^64/phi and keep the top bits. Device
 * pointers are aligned (256 bytes and more), so their low bits carry
 * nothing; the product's top bits depend on every bit above them. */
static inline uint32_t tag_of(uintptr_t p)
{
    return (uint32_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> 32);
}

/* The home slot: the tag scaled to the capacity. Monotonic in the tag,
 * like the top bits of the hash were, and any capacity works. */
static inline size_t home_of(uint32_t tag, size_t cap)
{
    return (size_t)(((uint64_t)tag * cap) >> 32);
}

static inline size_t next_slot(size_t i, size_t cap)
{
    return i + 1 == cap ? 0 : i + 1;
}

/* How far slot `j` is past slot `from`, going forward around the array. */
static inline size_t dist(size_t from, size_t j, size_t cap)
{
    return j >= from ? j - from : j + cap - from;
}

static size_t grown(size_t cap)
{
    size_t n = cap + cap / 2;
    return n > CAP_MAX ? CAP_MAX : n;
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
    shim_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    size_t cap = CAP_MIN;
    while (cap * 3 / 4 < initial_capacity && cap < CAP_MAX)
        cap = grown(cap);
    t->slots = slots_new(cap);
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->cap = cap;
    t->key = key;
    t->ctx = ctx;
    atomic_store_explicit(&t->hint_slots, t->slots, memory_order_relaxed);
    atomic_store_explicit(&t->hint_cap, cap, memory_order_relaxed);
    return t;
}

void shim_table_destroy(shim_table *t)
{
    if (!t)
        return;
    shim_hostmem_free(t->slots, t->cap * sizeof *t->slots);
    shim_hostmem_free(t->fields, t->fields_cap * sizeof *t->fields);
    free(t);
}

static void place(slot *slots, size_t cap, slot e);

static int rehash(shim_table *t, size_t cap)
{
    if (cap <= t->cap)
        return -1;
    slot *ns = slots_new(cap);
    if (!ns)
        return -1;
    for (size_t i = 0; i < t->cap; i++)
        if (t->slots[i].id != SHIM_TABLE_NONE)
            place(ns, cap, t->slots[i]);
    shim_hostmem_free(t->slots, t->cap * sizeof *t->slots);
    t->slots = ns;
    t->cap = cap;
    atomic_store_explicit(&t->hint_slots, ns, memory_order_relaxed);
    atomic_store_explicit(&t->hint_cap, cap, memory_order_relaxed);
    return 0;
}

static int fields_reserve(shim_table *t, uint32_t id)
{
    if (id < t->fields_cap)
        return 0;
    size_t cap = t->fields_cap ? t->fields_cap : 1024;
    while (cap <= id)
        cap *= 2;
    shim_live_fields *nf = shim_hostmem_grow(t->fields, t->fields_cap * sizeof *nf, cap * sizeof *nf);
    if (!nf)
        return -1;
    t->fields = nf;
    t->fields_cap = cap;
    return 0;
}

/* Robin Hood order: along a run, no entry is further from its home than
 * the entry after it would be from its own at that slot. A search stops at
 * the first entry closer to its home than the searched key would be, and
 * a removal shifts back only until an entry sits at its home, so neither
 * walks a whole run at loads near 3/4 (plain linear probing did: a removal
 * scanned to the next empty slot, two lines on average at that load). */

/* Places `e` (not in the table) in `slots`, displacing entries that sit
 * closer to their home than `e` would. */
static void place(slot *slots, size_t cap, slot e)
{
    size_t i = home_of(e.tag, cap), d = 0;
    for (;;) {
        slot *s = &slots[i];
        if (s->id == SHIM_TABLE_NONE) {
            *s = e;
            return;
        }
        size_t sd = dist(home_of(s->tag, cap), i, cap);
        if (sd < d) {
            slot x = *s;
            *s = e;
            e = x;
            d = sd;
        }
        i = next_slot(i, cap);
        d++;
    }
}

/* The slot holding `ptr`, or SIZE_MAX. */
static size_t lookup(const shim_table *t, uintptr_t ptr)
{
    if (ptr == 0)
        return SIZE_MAX;
    uint32_t tag = tag_of(ptr);
    for (size_t i = home_of(tag, t->cap), d = 0;; i = next_slot(i, t->cap), d++) {
        const slot *s = &t->slots[i];
        if (s->id == SHIM_TABLE_NONE || dist(home_of(s->tag, t->cap), i, t->cap) < d)
            return SIZE_MAX;
        if (s->tag == tag && t->key(t->ctx, s->id) == ptr)
            return i;
    }
}

int shim_table_insert(shim_table *t, uintptr_t ptr, uint32_t id, const shim_live_fields *f)
{
    if (ptr == 0 || id == SHIM_TABLE_NONE || fields_reserve(t, id) != 0)
        return -1;
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX) {
        if ((t->count + 1) * 4 > t->cap * 3 && rehash(t, grown(t->cap)) != 0)
            return -1;
        place(t->slots, t->cap, (slot){ .tag = tag_of(ptr), .id = id });
        t->count++;
    } else {
        t->slots[i].id = id;
    }
    t->fields[id] = f ? *f : (shim_live_fields){ 0 };
    return 0;
}

uint32_t shim_table_remove(shim_table *t, uintptr_t ptr, shim_live_fields *out)
{
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX)
        return SHIM_TABLE_NONE;
    uint32_t id = t->slots[i].id;
    if (out)
        *out = t->fields[id];
    /* Backward shift: each following entry not at its home moves back one
     * slot; the first one at its home (or an empty slot) ends the run. */
    size_t hole = i;
    for (size_t j = next_slot(i, t->cap);
         t->slots[j].id != SHIM_TABLE_NONE && home_of(t->slots[j].tag, t->cap) != j;
         j = next_slot(j, t->cap)) {
        t->slots[hole] = t->slots[j];
        hole = j;
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

const shim_live_fields *shim_table_fields(const shim_table *t, uint32_t id)
{
    return id < t->fields_cap ? &t->fields[id] : NULL;
}

size_t shim_table_count(const shim_table *t)
{
    return t->count;
}

void shim_table_foreach(const shim_table *t,
                        void (*fn)(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user),
                        void *user)
{
    for (size_t i = 0; i < t->cap; i++) {
        uint32_t id = t->slots[i].id;
        if (id != SHIM_TABLE_NONE)
            fn(t->key(t->ctx, id), id, &t->fields[id], user);
    }
}

size_t shim_table_meta_bytes(const shim_table *t)
{
    return sizeof *t + shim_hostmem_size(t->cap * sizeof *t->slots) +
           shim_hostmem_size(t->fields_cap * sizeof *t->fields);
}

void shim_table_prefetch(const shim_table *t, uintptr_t ptr)
{
    uintptr_t s = (uintptr_t)atomic_load_explicit(&t->hint_slots, memory_order_relaxed);
    size_t cap = atomic_load_explicit(&t->hint_cap, memory_order_relaxed);
    /* Integer arithmetic: with a stale pair the address may lie outside
     * any array, which a prefetch tolerates and C pointers do not. */
    __builtin_prefetch((const void *)(s + home_of(tag_of(ptr), cap) * sizeof(slot)));
}
