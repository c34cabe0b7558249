/* Live allocations: device pointer -> arena node id, plus each live
 * block's leak-hunting fields by node id.
 *
 * Owns: a power-of-two array of 8-byte slots {tag, id}, open addressing
 * with linear probing (eight slots to a cache line), and an array of
 * fields (the sequence number) indexed by node id. The tag is the top 32 bits of the pointer's
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
    shim_table_hint hint;          /* first: read by the inline prefetch (table.h) */
    slot *slots;
    size_t mask;                   /* capacity - 1 */
    unsigned bits;                 /* log2(capacity), <= 32 */
    size_t count;
    shim_live_fields *fields;      /* by node id */
    size_t fields_cap;
    shim_table_key_fn key;
    const void *ctx;
};
_Static_assert(sizeof(slot) == 8, "shim_table_prefetch's slot size");


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
    atomic_store_explicit(&t->hint.slots, (uintptr_t)t->slots, memory_order_relaxed);
    atomic_store_explicit(&t->hint.bits, bits, memory_order_relaxed);
    return t;
}

void shim_table_destroy(shim_table *t)
{
    if (!t)
        return;
    shim_hostmem_free(t->slots, (t->mask + 1) * sizeof *t->slots);
    shim_hostmem_free(t->fields, t->fields_cap * sizeof *t->fields);
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
        size_t j = shim_table_home(t->slots[i].tag, bits);
        while (ns[j].id != SHIM_TABLE_NONE)
            j = (j + 1) & mask;
        ns[j] = t->slots[i];
    }
    shim_hostmem_free(t->slots, (t->mask + 1) * sizeof *t->slots);
    t->slots = ns;
    t->mask = mask;
    t->bits = bits;
    atomic_store_explicit(&t->hint.slots, (uintptr_t)ns, memory_order_relaxed);
    atomic_store_explicit(&t->hint.bits, bits, memory_order_relaxed);
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

/* The slot holding `ptr`, or SIZE_MAX. */
static size_t lookup(const shim_table *t, uintptr_t ptr)
{
    if (ptr == 0)
        return SIZE_MAX;
    uint32_t tag = shim_table_tag(ptr);
    for (size_t i = shim_table_home(tag, t->bits);; i = (i + 1) & t->mask) {
        const slot *s = &t->slots[i];
        if (s->id == SHIM_TABLE_NONE)
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
        if ((t->count + 1) * 4 > (t->mask + 1) * 3 && rehash(t, t->bits + 1) != 0)
            return -1;
        uint32_t tag = shim_table_tag(ptr);
        for (i = shim_table_home(tag, t->bits); t->slots[i].id != SHIM_TABLE_NONE; i = (i + 1) & t->mask)
            ;
        t->slots[i].tag = tag;
        t->count++;
    }
    t->slots[i].id = id;
    t->fields[id] = f ? *f : (shim_live_fields){ 0 };
    return 0;
}

/* Stores a new entry; there is room (load and fields checked). */
static inline void add_entry(shim_table *t, uintptr_t ptr, uint32_t id, const shim_live_fields *f)
{
    uint32_t tag = shim_table_tag(ptr);
    size_t i = shim_table_home(tag, t->bits);
    while (t->slots[i].id != SHIM_TABLE_NONE)
        i = (i + 1) & t->mask;
    t->slots[i] = (slot){.tag = tag, .id = id};
    t->count++;
    t->fields[id] = f ? *f : (shim_live_fields){ 0 };
}

/* shim_table_add when the table must grow first (or the call is bad): out
 * of line and reached by a tail call, so that the common call saves no
 * registers for it. */
__attribute__((noinline)) static int add_grow(shim_table *t, uintptr_t ptr, uint32_t id,
                                              const shim_live_fields *f)
{
    if (ptr == 0 || id == SHIM_TABLE_NONE || fields_reserve(t, id) != 0)
        return -1;
    if ((t->count + 1) * 4 > (t->mask + 1) * 3 && rehash(t, t->bits + 1) != 0)
        return -1;
    add_entry(t, ptr, id, f);
    return 0;
}

int shim_table_add(shim_table *t, uintptr_t ptr, uint32_t id, const shim_live_fields *f)
{
    if (ptr == 0 || id >= t->fields_cap || (t->count + 1) * 4 > (t->mask + 1) * 3)
        return add_grow(t, ptr, id, f);
    add_entry(t, ptr, id, f);
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
    /* Backward shift: move each later entry of the run into the hole when
     * the hole lies on its probe path (between its home slot and it). */
    size_t hole = i;
    for (size_t j = (i + 1) & t->mask; t->slots[j].id != SHIM_TABLE_NONE; j = (j + 1) & t->mask) {
        size_t home = shim_table_home(t->slots[j].tag, t->bits);
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
    for (size_t i = 0; i <= t->mask; i++) {
        uint32_t id = t->slots[i].id;
        if (id != SHIM_TABLE_NONE)
            fn(t->key(t->ctx, id), id, &t->fields[id], user);
    }
}

size_t shim_table_meta_bytes(const shim_table *t)
{
    return sizeof *t + shim_hostmem_size((t->mask + 1) * sizeof *t->slots) +
           shim_hostmem_size(t->fields_cap * sizeof *t->fields);
}
