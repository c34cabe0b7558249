/* Live allocations: device pointer -> the arena node of its block, and the
 * block's sequence number, kept apart from the node because only
 * allocation writes it and only reports read it, with the frees once some
 * thread is counted, thread_live.h (the stack ids fit in the
 * node: shim_arena_set_tags). Open addressing with linear probing and
 * tombstones, live entries' load kept under 1/2 (3/4 above 2^16 slots),
 * the array rebuilt when tombstones pile up, so insert, find and remove
 * are O(1) (amortized). A slot holds the pointer
 * itself (as a multiple of the alignment) and the node id, so that a free
 * is confirmed and removed without reading the node. Host memory only.
 * Not thread-safe: the owner serializes calls with the allocator lock
 * (shim_table_prefetch excepted). */
#ifndef SHIM_TABLE_H
#define SHIM_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHIM_TABLE_NONE UINT32_MAX

/* A live block as reports see it: assembled from the table and the arena
 * (shim_device_live). */
typedef struct shim_record {
    uintptr_t ptr;
    uint64_t size;           /* bytes the program asked for */
    uint64_t seq;            /* allocation sequence number */
    uint32_t node;           /* arena block handle */
    uint32_t native_stack;   /* interned stack id, 0 = none */
    uint32_t python_stack;   /* interned stack id, 0 = none */
    uint32_t flags;
    uint16_t thread;         /* the allocating thread's slot, 0: not counted (thread_live.h) */
} shim_record;

/* What the table keeps of a live block besides its node: written once at
 * allocation, read by reports only (never on the free path). */
typedef struct shim_live_fields {
    /* The sequence number (low SHIM_LIVE_SEQ_BITS bits) and the
     * allocating thread's slot above it (0: not counted, thread_live.h):
     * 8 bytes a block, as before the thread was kept. Sequence numbers
     * stay below 2^48 (at 10^8 allocations a second, 32 days). A plain
     * word, not bit-fields: a thread not counted stores its number as it
     * is, with no masking on the allocation path. Read it with
     * shim_live_seq and shim_live_thread. */
    uint64_t word;
} shim_live_fields;
_Static_assert(sizeof(shim_live_fields) == 8, "a block's fields stay 8 bytes");

#define SHIM_LIVE_SEQ_BITS 48

static inline shim_live_fields shim_live_make(uint64_t seq, uint16_t thread)
{
    return (shim_live_fields){.word = seq | (uint64_t)thread << SHIM_LIVE_SEQ_BITS};
}

static inline uint64_t shim_live_seq(const shim_live_fields *f)
{
    return f->word & (((uint64_t)1 << SHIM_LIVE_SEQ_BITS) - 1);
}

static inline uint16_t shim_live_thread(const shim_live_fields *f)
{
    return (uint16_t)(f->word >> SHIM_LIVE_SEQ_BITS);
}

typedef struct shim_table shim_table;

/* `align_shift`: log2 of the alignment the owner's pointers have (the
 * arena's); any pointer can be stored, aligned ones below 2^(39 + shift)
 * with node ids below 2^25 take the compact form. */
shim_table *shim_table_create(size_t initial_capacity, unsigned align_shift);
void shim_table_destroy(shim_table *t);
/* Inserts `ptr` (0 is never stored, nor the id SHIM_TABLE_NONE) with its
 * node id and fields; `ptr` is known not to be in the table (the arena
 * just handed the block out), so nothing is searched for. 0, or -1 if
 * growing failed. */
int shim_table_add(shim_table *t, uintptr_t ptr, uint32_t id, const shim_live_fields *f);
/* Removes `ptr`, returning its node id (and its fields in *out when not
 * NULL), or SHIM_TABLE_NONE when absent. */
uint32_t shim_table_remove(shim_table *t, uintptr_t ptr, shim_live_fields *out);
/* The node id of `ptr`, or SHIM_TABLE_NONE. */
uint32_t shim_table_find(const shim_table *t, uintptr_t ptr);
/* The same with its fields in *out when not NULL (the allocation's
 * sequence number answers pointer queries: a buffer id). */
uint32_t shim_table_find_fields(const shim_table *t, uintptr_t ptr, shim_live_fields *out);
size_t shim_table_count(const shim_table *t);
/* Visits every live entry; `fn` must not modify the table. */
void shim_table_foreach(const shim_table *t,
                        void (*fn)(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user),
                        void *user);
/* The same, for a walk that reads more than the slot (a copy of every
 * live record): `ahead(id, user)` is called for the entry SHIM_TABLE_AHEAD
 * slots further on, so that the caller starts loading what it will read
 * of it (its node), and its fields' line is prefetched here; the misses of
 * one entry overlap the work on the ones before. */
#define SHIM_TABLE_AHEAD 16
void shim_table_foreach_ahead(const shim_table *t,
                              void (*fn)(uintptr_t ptr, uint32_t id, const shim_live_fields *f,
                                         void *user),
                              void (*ahead)(uint32_t id, void *user), void *user);
/* Host bytes the table's arrays take (mapped, not all resident). */
size_t shim_table_meta_bytes(const shim_table *t);
/* The slot array and its size as shim_table_prefetch reads them, without
 * the lock: the table's first member, so that the prefetch is inline. */
typedef struct shim_table_hint {
    _Atomic uintptr_t slots;
    _Atomic unsigned bits;
    _Atomic uintptr_t fields;      /* shim_table_prefetch_fields */
} shim_table_hint;

/* The home slot of a pointer in a table of 2^bits (Fibonacci hashing:
 * multiply by 2^64/phi and keep the top bits; device pointers are aligned,
 * so their low bits carry nothing, and the product's top bits depend on
 * every bit above them). */
static inline size_t shim_table_home(uintptr_t p, unsigned bits)
{
    return (size_t)(((uint64_t)p * 0x9e3779b97f4a7c15ull) >> (64 - bits));
}

/* Without the lock: starts loading the line where `ptr` would be found, so
 * that the miss overlaps taking the lock. A hint only: it reads nothing it
 * acts on and may touch a stale array (a prefetch never faults). */
static inline void shim_table_prefetch(const shim_table *t, uintptr_t ptr)
{
    const shim_table_hint *h = (const shim_table_hint *)(const void *)t;
    uintptr_t s = atomic_load_explicit(&h->slots, memory_order_relaxed);
    unsigned bits = atomic_load_explicit(&h->bits, memory_order_relaxed);
    /* Integer arithmetic: with a stale pair the address may lie outside
     * any array, which a prefetch tolerates and C pointers do not. Each
     * slot is 8 bytes. */
    __builtin_prefetch((const void *)(s + shim_table_home(ptr, bits) * 8));
}

/* Starts loading, for writing, the line of node id `id`'s fields: a free
 * calls it, so that the allocation that takes the block back soon does not
 * wait for that line when it writes them. A hint: `id` need not be in the
 * table. */
static inline void shim_table_prefetch_fields(const shim_table *t, uint32_t id)
{
    const shim_table_hint *h = (const shim_table_hint *)(const void *)t;
    uintptr_t f = atomic_load_explicit(&h->fields, memory_order_relaxed);
    __builtin_prefetch((const void *)(f + (uintptr_t)id * sizeof(shim_live_fields)), 1);
}

#endif
