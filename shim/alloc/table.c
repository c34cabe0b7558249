/* Live allocations: device pointer -> arena node id, plus each live
 * block's leak-hunting fields by node id.
 *
 * Owns: a power-of-two array of 8-byte slots, open addressing with linear
 * probing (eight slots to a cache line); an array of fields (the sequence
 * number) indexed by node id; and the few entries that do not fit a slot
 * (the wide array).
 *
 * A slot is the pointer divided by the alignment in its top 39 bits and
 * the node id in its low 25: a probe confirms a match from the slot alone,
 * so a free touches the slot's line and not the node's (the node's work
 * can then wait: held.c), and deletion finds each entry's home from the
 * slot too. 39 bits cover every address below 2^47 at 256-byte alignment
 * (the user half of x86-64 and of the devices' unified address space); 25
 * bits, 32 million nodes. An entry beyond either, or a pointer that is not
 * aligned, goes to the wide array, and its slot holds the reserved key
 * WIDE and the entry's index there; a probe compares those by pointer.
 * The empty slot is all ones, the tombstone all ones less one: the key
 * WIDE with indices the wide array never hands out.
 *
 * Deletion leaves a tombstone, which a probe passes over and an insertion
 * takes. It used to shift the following run back: a loop whose exit
 * depends on the line of the slot just found, which at a million live
 * blocks is still on its way from memory, and mispredicted half the time;
 * each misprediction threw away the work the processor had run ahead on
 * (the next allocation, the program's next free), and tombstones made a
 * pair at a million live blocks 25% faster. Live entries keep the load at
 * or under 1/2 up to SMALL_SLOTS slots and at or under 3/4 above; with
 * tombstones past that the array is rebuilt once they are 1/8 of it
 * (small) or 1/16 (large), and until then may be fuller by that much. The
 * rebuild keeps the size when that leaves room for as many tombstones
 * again, so that many frees pass between rebuilds; with the live entries
 * that near the limit it doubles (must_grow, add_slow).
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

#define ID_BITS 25
#define ID_MASK ((UINT64_C(1) << ID_BITS) - 1)
#define KEY_WIDE ((UINT64_C(1) << (64 - ID_BITS)) - 1)
#define EMPTY UINT64_MAX
#define TOMB (UINT64_MAX - 1)
/* Up to this many slots (512 KiB) the table grows at a load of 1/2, above
 * it at 3/4: see must_grow. */
#define SMALL_SLOTS ((size_t)1 << 16)
/* A key no slot has: what a pointer that cannot be compact looks for. */
#define KEY_NOWHERE (KEY_WIDE + 1)

typedef struct wide_entry {
    uintptr_t ptr;
    uint32_t id;
    uint32_t next_free;        /* chains unused entries */
} wide_entry;

struct shim_table {
    shim_table_hint hint;          /* first: read by the inline prefetch (table.h) */
    uint64_t *slots;
    size_t mask;                   /* capacity - 1 */
    unsigned bits;                 /* log2(capacity), <= 32 */
    unsigned shift;                /* log2 of the pointers' alignment */
    size_t count;
    size_t tombs;                  /* TOMB slots */
    shim_live_fields *fields;      /* by node id */
    size_t fields_cap;
    wide_entry *wide;
    uint32_t wide_cap, wide_used, wide_free;
};

static inline uint64_t slot_key(uint64_t s)
{
    return s >> ID_BITS;
}

/* The key `ptr` has in a compact slot, or KEY_NOWHERE. */
static inline uint64_t key_of(const shim_table *t, uintptr_t ptr)
{
    uint64_t k = (uint64_t)ptr >> t->shift;
    bool aligned = (ptr & (((uintptr_t)1 << t->shift) - 1)) == 0;
    return aligned && k < KEY_WIDE ? k : KEY_NOWHERE;
}

static inline uintptr_t slot_ptr(const shim_table *t, uint64_t s)
{
    uint64_t k = slot_key(s);
    return k == KEY_WIDE ? t->wide[s & ID_MASK].ptr : (uintptr_t)(k << t->shift);
}

static inline uint32_t slot_id(const shim_table *t, uint64_t s)
{
    return slot_key(s) == KEY_WIDE ? t->wide[s & ID_MASK].id : (uint32_t)(s & ID_MASK);
}

static uint64_t *slots_new(size_t cap)
{
    uint64_t *s = shim_hostmem_grow(NULL, 0, cap * sizeof *s);
    if (s)
        memset(s, 0xff, cap * sizeof *s); /* EMPTY */
    return s;
}

shim_table *shim_table_create(size_t initial_capacity, unsigned align_shift)
{
    if (align_shift >= 32)
        return NULL;
    shim_table *t = shim_hostmem_lines(sizeof *t);
    if (!t)
        return NULL;
    unsigned bits = 4;
    while (((size_t)1 << bits) / 2 < initial_capacity && bits < 32)
        bits++;
    t->slots = slots_new((size_t)1 << bits);
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->bits = bits;
    t->mask = ((size_t)1 << bits) - 1;
    t->shift = align_shift;
    t->wide_free = UINT32_MAX;
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
    shim_hostmem_free(t->wide, (size_t)t->wide_cap * sizeof *t->wide);
    free(t);
}

static int rehash(shim_table *t, unsigned bits)
{
    if (bits > 32)
        return -1;
    size_t cap = (size_t)1 << bits, mask = cap - 1;
    uint64_t *ns = slots_new(cap);
    if (!ns)
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->slots[i] >= TOMB)
            continue;
        size_t j = shim_table_home(slot_ptr(t, t->slots[i]), bits);
        while (ns[j] != EMPTY)
            j = (j + 1) & mask;
        ns[j] = t->slots[i];
    }
    shim_hostmem_free(t->slots, (t->mask + 1) * sizeof *t->slots);
    t->slots = ns;
    t->mask = mask;
    t->bits = bits;
    t->tombs = 0;
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
    atomic_store_explicit(&t->hint.fields, (uintptr_t)nf, memory_order_relaxed);
    return 0;
}

/* A wide entry for (ptr, id): its slot, or EMPTY when out of memory. */
static uint64_t wide_take(shim_table *t, uintptr_t ptr, uint32_t id)
{
    uint32_t w = t->wide_free;
    if (w != UINT32_MAX) {
        t->wide_free = t->wide[w].next_free;
    } else {
        if (t->wide_used == t->wide_cap) {
            uint32_t cap = t->wide_cap ? t->wide_cap * 2 : 64;
            if (cap > ID_MASK - 1) /* indices ID_MASK - 1 and ID_MASK read as TOMB, EMPTY */
                cap = ID_MASK - 1;
            if (cap == t->wide_cap)
                return EMPTY;
            wide_entry *nw = shim_hostmem_grow(t->wide, (size_t)t->wide_cap * sizeof *nw,
                                               (size_t)cap * sizeof *nw);
            if (!nw)
                return EMPTY;
            t->wide = nw;
            t->wide_cap = cap;
        }
        w = t->wide_used++;
    }
    t->wide[w] = (wide_entry){.ptr = ptr, .id = id};
    return KEY_WIDE << ID_BITS | w;
}

static void wide_drop(shim_table *t, uint64_t s)
{
    uint32_t w = (uint32_t)(s & ID_MASK);
    t->wide[w].next_free = t->wide_free;
    t->wide_free = w;
}

/* The slot for (ptr, id): compact when it can be, else a wide entry
 * (EMPTY when out of memory). */
static uint64_t slot_for(shim_table *t, uintptr_t ptr, uint32_t id)
{
    uint64_t k = key_of(t, ptr);
    if (k != KEY_NOWHERE && id <= ID_MASK)
        return k << ID_BITS | id;
    return wide_take(t, ptr, id);
}

/* The slot holding `ptr`, or SIZE_MAX. */
static size_t lookup(const shim_table *t, uintptr_t ptr)
{
    if (ptr == 0)
        return SIZE_MAX;
    uint64_t k = key_of(t, ptr);
    for (size_t i = shim_table_home(ptr, t->bits);; i = (i + 1) & t->mask) {
        uint64_t s = t->slots[i];
        if (s == EMPTY)
            return SIZE_MAX;
        if (s == TOMB)
            continue;
        uint64_t sk = slot_key(s);
        if (sk == k || (sk == KEY_WIDE && t->wide[s & ID_MASK].ptr == ptr))
            return i;
    }
}

/* Stores slot `s` for `ptr` (not in the table; there is room). */
static inline void place(shim_table *t, uintptr_t ptr, uint64_t s)
{
    size_t i = shim_table_home(ptr, t->bits);
    while (t->slots[i] < TOMB)
        i = (i + 1) & t->mask;
    t->tombs -= t->slots[i] == TOMB;
    t->slots[i] = s;
    t->count++;
}

/* The most live entries an array of `cap` slots holds. A small table
 * keeps its load at or under 1/2: probes then stop after a slot or two,
 * where at 0.6 (10,000 live blocks under a 3/4 rule) they took a fifth of
 * a pair, most of it in mispredicted loop exits; that costs 256 KiB at
 * most. A large table keeps 3/4, or just above a power of two of live
 * blocks it would take 32 bytes a block, and the node (32) and the
 * sequence number (8) with it pass 64 (docs/allocator.md). */
static inline size_t load_limit(size_t cap)
{
    return cap <= SMALL_SLOTS ? cap / 2 : cap / 4 * 3;
}

/* The tombstones an array may hold past the load limit before a rebuild
 * (5/8 of it used at most when small, 13/16 when large). */
static inline size_t tomb_allowance(size_t cap)
{
    return cap <= SMALL_SLOTS ? cap / 8 : cap / 16;
}

/* Whether one more entry goes through add_slow: the live entries and the
 * tombstones together at the limit. */
static inline bool must_grow(const shim_table *t)
{
    return t->count + t->tombs + 1 > load_limit(t->mask + 1);
}

/* shim_table_add when the table must grow first, the entry is wide (or
 * the call is bad): out of line and reached by a tail call, so that the
 * common call saves no registers for it. */
__attribute__((noinline)) static int add_slow(shim_table *t, uintptr_t ptr, uint32_t id,
                                              const shim_live_fields *f)
{
    if (ptr == 0 || id == SHIM_TABLE_NONE || fields_reserve(t, id) != 0)
        return -1;
    size_t cap = t->mask + 1, limit = load_limit(cap), allow = tomb_allowance(cap);
    if (t->count + 1 > limit) {
        if (rehash(t, t->bits + 1) != 0)
            return -1;
    } else if (must_grow(t) && t->tombs >= allow) {
        /* Rebuilt at its size when that leaves room for `allow` more
         * tombstones, so that at least that many frees pass before the
         * next rebuild; else (the live entries near the limit) doubled. */
        unsigned bits = limit - t->count >= allow ? t->bits : t->bits + 1;
        if (rehash(t, bits) != 0 && t->count + t->tombs + 2 >= cap)
            return -1; /* (a rebuild that failed, with no room left anyway) */
    }
    /* Otherwise over the limit by fewer than `allow` tombstones: a slot
     * stays empty, so probes still end. */
    uint64_t s = slot_for(t, ptr, id);
    if (s == EMPTY)
        return -1;
    place(t, ptr, s);
    t->fields[id] = f ? *f : (shim_live_fields){ 0 };
    return 0;
}

int shim_table_add(shim_table *t, uintptr_t ptr, uint32_t id, const shim_live_fields *f)
{
    uint64_t k = key_of(t, ptr);
    if (ptr == 0 || k == KEY_NOWHERE || id > ID_MASK || id >= t->fields_cap || must_grow(t))
        return add_slow(t, ptr, id, f);
    place(t, ptr, k << ID_BITS | id);
    t->fields[id] = f ? *f : (shim_live_fields){ 0 };
    return 0;
}

uint32_t shim_table_remove(shim_table *t, uintptr_t ptr, shim_live_fields *out)
{
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX)
        return SHIM_TABLE_NONE;
    uint64_t s = t->slots[i];
    uint32_t id = slot_id(t, s);
    if (slot_key(s) == KEY_WIDE)
        wide_drop(t, s);
    if (out)
        *out = t->fields[id];
    t->slots[i] = TOMB;
    t->tombs++;
    t->count--;
    return id;
}

uint32_t shim_table_find(const shim_table *t, uintptr_t ptr)
{
    return shim_table_find_fields(t, ptr, NULL);
}

uint32_t shim_table_find_fields(const shim_table *t, uintptr_t ptr, shim_live_fields *out)
{
    size_t i = lookup(t, ptr);
    if (i == SIZE_MAX)
        return SHIM_TABLE_NONE;
    uint32_t id = slot_id(t, t->slots[i]);
    if (out)
        *out = t->fields[id];
    return id;
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
        uint64_t s = t->slots[i];
        if (s < TOMB) {
            uint32_t id = slot_id(t, s);
            fn(slot_ptr(t, s), id, &t->fields[id], user);
        }
    }
}

void shim_table_foreach_ahead(const shim_table *t,
                              void (*fn)(uintptr_t ptr, uint32_t id, const shim_live_fields *f,
                                         void *user),
                              void (*ahead)(uint32_t id, void *user), void *user)
{
    size_t n = t->mask + 1;
    for (size_t i = 0; i < n; i++) {
        if (i + SHIM_TABLE_AHEAD < n) {
            uint64_t a = t->slots[i + SHIM_TABLE_AHEAD];
            if (a < TOMB) {
                uint32_t aid = slot_id(t, a);
                __builtin_prefetch(&t->fields[aid]);
                ahead(aid, user);
            }
        }
        uint64_t s = t->slots[i];
        if (s < TOMB) {
            uint32_t id = slot_id(t, s);
            fn(slot_ptr(t, s), id, &t->fields[id], user);
        }
    }
}

size_t shim_table_meta_bytes(const shim_table *t)
{
    return sizeof *t + shim_hostmem_size((t->mask + 1) * sizeof *t->slots) +
           shim_hostmem_size(t->fields_cap * sizeof *t->fields) +
           shim_hostmem_size((size_t)t->wide_cap * sizeof *t->wide);
}
