/* Pass-through allocations: memory the shim never serves from its regions
 * but watches, so that statistics, leak reports and the out-of-memory
 * report see it (docs/cuda.md's table). Today: CUDA managed memory
 * (counted on the device it was allocated on), host-pinned memory (a
 * family of its own, host memory), VMM physical allocations (by
 * handle, with the range they are mapped at) and stream-ordered
 * allocations (cuda-async: what the program holds from the driver's
 * pools, on the device of the calling context), and OpenCL's memory
 * objects and SVM (on their device, with the program's reference counts:
 * the runtime's own count includes its references). Their limits are charge.c's:
 * a record only remembers the pool it was charged to.
 *
 * Owns the live records (pointer -> size, family, device, stacks,
 * sequence) and the counters per family and device. The records are an
 * open-addressing table: a power-of-two array of slots of one cache line
 * each, found by a multiplicative hash of the pointer and linear probing,
 * each slot the whole record (only a VMM handle's list of mappings is a
 * side allocation), so that a free reads one line where a chained table
 * read two dependent ones, the bucket's head and then the record's node
 * (the main cost of a free, bench/opencl_pair.sh, docs/opencl.md's
 * cost), and a record costs no malloc. A removal moves the records after
 * it in its run back (no tombstones), and the array doubles while the
 * records fill a third of it: a run is short, and a look-up that finds a
 * record alone of its pointer stops there.
 *
 * One lock, pt_mu, guards the table and the counters; it is a leaf:
 * nothing is called with it held but malloc-free bookkeeping
 * (docs/locking.md): the rebuilt array is had before it and the old one
 * freed after it. Stacks are captured before it is taken, on the
 * allocating thread. Each record's add and each free take it once: an
 * OpenCL create and release pair, a hundred nanoseconds in the runtime,
 * pays two round trips, so it is a word taken with one exchange and
 * released with a plain store (a pthread mutex's release is a second
 * locked instruction), waited on by spinning, then yielding: what it
 * guards is a few dozen instructions that never block. (Slots updated by
 * compare-and-swap with no lock were weighed: a create and a release
 * would each still pay a locked instruction, the exchange's cost, for
 * the key, and the counters per family and device, the peak, the
 * sequence and the rebuild would need theirs: no fewer, and a reader
 * racing a rebuild needs an epoch.)
 *
 * Never calls the runtime (the hooks do, and record only what it
 * accepted) and never dereferences a recorded pointer. */
#include "passthrough.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "device.h"
#include "mutex.h"
#include "pool.h"
#include "pressure.h"


#define FIRST_BITS 10 /* 1,024 slots to begin with (static: no malloc at the first record) */
#define ORDINALS 64 /* device ordinals counted one by one; slot 0 is the host (-1) */

/* A mapping of a VMM handle; a handle may be mapped at several addresses
 * at once, and its memory lives while any is. */
typedef struct pt_map {
    uintptr_t va;
    uint64_t size;
} pt_map;

/* A VMM record's mappings (malloc'd, freed after pt_mu): n live of cap;
 * the last is the one a leak report names. */
typedef struct pt_maps {
    unsigned n, cap;
    pt_map v[];
} pt_maps;

enum { SLOT_EMPTY, SLOT_LIVE };

/* One record: a cache line, the table aligned to lines, so that finding
 * a record and reading what its free needs is one line. `twin`: another
 * live record of the same pointer and family was seen when it was added
 * or while it lived (a runtime freed and gave the address again before
 * the shim heard of the free): a look-up that finds a record without it
 * stops there; with it, it reads the whole run to pick by sequence. */
typedef struct pt_slot {
    uintptr_t ptr;
    uint64_t size;
    struct shim_arena_pool *charged; /* the account's pool charged, or NULL */
    uint64_t seq;
    uint32_t refs; /* the program's references (retain/unref) */
    int32_t ordinal;
    int32_t device;
    uint32_t native_stack, python_stack;
    uint8_t state, family, twin, released;
    pt_maps *maps; /* VMM's, or NULL */
} __attribute__((aligned(64))) pt_slot;
_Static_assert(sizeof(pt_slot) == 64, "a slot is one cache line");
/* pt_mu: 0 free, 1 held (see the header comment); counted in the
 * thread's shim locks (mutex.h) as a mutex would be. */
static _Atomic unsigned pt_mu;

__attribute__((noinline, cold)) static void pt_wait(void)
{
    for (unsigned spins = 0;; spins++) {
        if (atomic_load_explicit(&pt_mu, memory_order_relaxed) == 0 &&
            atomic_exchange_explicit(&pt_mu, 1, memory_order_acquire) == 0)
            return;
        if (spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield(); /* the holder may be preempted: let it run */
        }
    }
}

static inline void pt_lock(void)
{
    /* One thread: nothing else can take it between the load and the
     * store (shim_single_threaded), and a locked exchange would be a full
     * barrier on each record. */
    if (shim_single_threaded() && atomic_load_explicit(&pt_mu, memory_order_relaxed) == 0)
        atomic_store_explicit(&pt_mu, 1, memory_order_relaxed);
    else if (atomic_exchange_explicit(&pt_mu, 1, memory_order_acquire) != 0)
        pt_wait();
    shim_locks_note_acquired();
}

static inline void pt_unlock(void)
{
    shim_locks_note_released();
    atomic_store_explicit(&pt_mu, 0, memory_order_release);
}

/* The slots (pt_mu): 2^table_bits of them, the live records under a
 * third of them (rebuild), so that a run of occupied slots is short and a
 * look-up ends at an empty one. */
static pt_slot first_table[1u << FIRST_BITS];
static pt_slot *table = first_table;
static unsigned table_bits = FIRST_BITS;
/* 2^table_bits - 1 and 64 - table_bits, kept: each look-up uses both. */
static size_t table_mask_v = (1u << FIRST_BITS) - 1;
static unsigned table_shift = 64 - FIRST_BITS;
static size_t nrecords; /* live records, all families */
/* Records removed from the table, ever (pt_mu): a removal moves records
 * back (vacate), so that a scan in batches (drop_where) starts again. */
static uint64_t nremovals;
static shim_pt_counters counters[SHIM_PT_FAMILIES][ORDINALS + 1];
static bool seen[SHIM_PT_FAMILIES][ORDINALS + 1];
_Atomic uint64_t shim_pt_live_count[SHIM_PT_FAMILIES];
static atomic_bool used;
static _Atomic(shim_pt_capture_fn) capture;
static _Atomic(shim_pt_event_fn) event_hook;
static _Atomic(shim_pt_trim_fn) trim_hook;

const char *shim_passthrough_family_name(enum shim_pt_family f)
{
    static const char *const names[SHIM_PT_FAMILIES] = {
        [SHIM_PT_MANAGED] = "cuda-managed",
        [SHIM_PT_HOST_PINNED] = "cuda-host-pinned",
        [SHIM_PT_VMM] = "cuda-vmm",
        [SHIM_PT_ASYNC] = "cuda-async",
        [SHIM_PT_OPENCL_MEM] = "opencl",
        [SHIM_PT_OPENCL_SVM] = "opencl-svm",
    };
    return (unsigned)f < SHIM_PT_FAMILIES ? names[f] : "cuda";
}

void shim_passthrough_set_capture(shim_pt_capture_fn fn)
{
    atomic_store(&capture, fn);
}

void shim_passthrough_set_event_hook(shim_pt_event_fn fn)
{
    atomic_store(&event_hook, fn);
}

void shim_passthrough_set_trim_hook(shim_pt_trim_fn fn)
{
    atomic_store(&trim_hook, fn);
}

void shim_passthrough_pool_trimmed(uintptr_t pool, size_t released)
{
    shim_pt_trim_fn fn = atomic_load(&trim_hook);
    if (fn)
        fn(shim_device_seq_next(), pool, released);
}
/* Written under pt_mu only, read without it: a plain load and store, no
 * locked instruction on the path of every record. */
static void live_count_add(enum shim_pt_family f, int delta)
{
    uint64_t v = atomic_load_explicit(&shim_pt_live_count[f], memory_order_relaxed);
    atomic_store_explicit(&shim_pt_live_count[f], v + (uint64_t)(int64_t)delta,
                          memory_order_relaxed);
}

/* Ordinals past ORDINALS share the last slot: counted, not told apart. */
static unsigned slot(int ordinal)
{
    if (ordinal < 0)
        return 0;
    return ordinal < ORDINALS ? (unsigned)ordinal + 1 : ORDINALS;
}

/* Families that are their device's own memory (OpenCL has no other):
 * traced and reported on the device, not on a pseudo-device of theirs. */
static bool on_device(enum shim_pt_family f)
{
    return f == SHIM_PT_OPENCL_MEM || f == SHIM_PT_OPENCL_SVM;
}

int shim_passthrough_reported_device(const shim_pt_record *r)
{
    return on_device(r->family) ? r->device : -1;
}


static size_t table_mask(void)
{
    return table_mask_v;
}

/* The pointer's first slot: the high bits of a multiplicative hash (the
 * low bits of a pointer are zeros of its alignment). */
static size_t home(uintptr_t ptr)
{
    return (size_t)((uint64_t)ptr * 0x9E3779B97F4A7C15ull >> table_shift);
}

/* Which of several live records of one pointer a look-up wants. */
enum need { ANY, WITH_REFS, WITH_REFS_OR_MAPS, NOT_RELEASED };

static bool fits(const pt_slot *s, enum need need)
{
    switch (need) {
    case WITH_REFS:
        return s->refs != 0;
    case WITH_REFS_OR_MAPS:
        return s->refs != 0 || (s->maps && s->maps->n);
    case NOT_RELEASED:
        return !s->released;
    default:
        return true;
    }
}

/* The live record of `ptr` and `f` that `need` accepts, the newest (or
 * the oldest) by sequence when there are several; NULL: none. pt_mu held. */
__attribute__((always_inline)) static inline pt_slot *find(enum shim_pt_family f, uintptr_t ptr,
                                                          bool oldest, enum need need)
{
    size_t m = table_mask();
    pt_slot *best = NULL;
    /* Unbounded: insert_slot keeps an empty slot, which ends every run. */
    for (size_t i = home(ptr);; i = (i + 1) & m) {
        pt_slot *s = &table[i];
        if (s->state == SLOT_EMPTY)
            break;
        if (s->ptr != ptr || s->family != f || !fits(s, need)) /* live: no other state */
            continue;
        if (!s->twin)
            return s; /* no other record of the pointer lives */
        if (!best || (oldest ? s->seq < best->seq : s->seq > best->seq))
            best = s;
    }
    return best;
}

/* The slot a new record of `ptr` goes to (the empty one that ends its
 * run), the live records of the same pointer in the run marked twins, and
 * so is the new one then; NULL when the table is full (a rebuild failed
 * for want of memory). pt_mu held. */
__attribute__((always_inline)) static inline pt_slot *insert_slot(enum shim_pt_family f,
                                                                 uintptr_t ptr)
{
    size_t m = table_mask();
    if (nrecords + 2 > m)
        return NULL; /* the last empty slot ends every look-up */
    bool twin = false;
    size_t i = home(ptr);
    for (;; i = (i + 1) & m) {
        pt_slot *s = &table[i];
        if (s->state == SLOT_EMPTY)
            break;
        if (s->ptr == ptr && s->family == f) {
            s->twin = 1;
            twin = true;
        }
    }
    table[i].twin = twin;
    return &table[i];
}

/* A removed record's slot freed, and the records after it in its run
 * that it kept from their first slot moved back (linear probing's
 * deletion without tombstones: a look-up still meets no empty slot
 * before its record, and none is left for a rebuild to sweep). pt_mu
 * held. */
__attribute__((always_inline)) static inline void vacate(pt_slot *s)
{
    size_t m = table_mask();
    size_t i = (size_t)(s - table);
    nremovals++;
    for (size_t j = (i + 1) & m;; j = (j + 1) & m) {
        pt_slot *t = &table[j];
        if (t->state == SLOT_EMPTY)
            break;
        /* t may move to i when its first slot is not in (i, j]. */
        size_t h = home(t->ptr);
        if (((j - h) & m) >= ((j - i) & m)) {
            table[i] = *t;
            i = j;
        }
    }
    table[i].state = SLOT_EMPTY;
    table[i].maps = NULL;
}

/* The bits of the array a table of nrecords live records should be
 * rebuilt to (0: as it is): doubled when they fill a third of it. pt_mu
 * held. */
static unsigned rebuild_bits(void)
{
    size_t cap = (size_t)1 << table_bits;
    return nrecords * 3 > cap ? table_bits + 1 : 0;
}

/* The table rebuilt to 2^bits slots, the live records moved (pt_mu not held: the new array is had before the
 * lock, the old one freed after it). Out of memory, or another thread
 * was first: nothing changes. */
__attribute__((noinline, cold)) static void rebuild(unsigned bits)
{
    if (bits > 40)
        return;
    size_t n = (size_t)1 << bits;
    pt_slot *fresh = NULL;
    if (posix_memalign((void **)&fresh, sizeof(pt_slot), n * sizeof *fresh) != 0)
        return;
    for (size_t i = 0; i < n; i++)
        fresh[i].state = SLOT_EMPTY;
    pt_slot *old = NULL;
    pt_lock();
    if (rebuild_bits() == bits) {
        size_t nold = table_mask() + 1;
        old = table;
        table = fresh;
        table_bits = bits;
        table_mask_v = n - 1;
        table_shift = 64 - bits;
        size_t m = n - 1;
        for (size_t b = 0; b < nold; b++) {
            if (old[b].state != SLOT_LIVE)
                continue;
            size_t i = home(old[b].ptr);
            while (table[i].state != SLOT_EMPTY)
                i = (i + 1) & m;
            table[i] = old[b];
        }
        fresh = NULL;
    }
    pt_unlock();
    free(fresh);
    if (old != first_table)
        free(old);
}

/* Inline in both adds: a create pays no call more. */
__attribute__((always_inline)) static inline void add_record(enum shim_pt_family f, int ordinal,
                                                            int device, uintptr_t ptr,
                                                            size_t size,
                                                            shim_arena_pool *charged)
{
    shim_pt_capture_fn cap = atomic_load_explicit(&capture, memory_order_relaxed);
    uint32_t ns = 0, ps = 0;
    if (cap)
        cap(&ns, &ps);
    if (__builtin_expect(!atomic_load_explicit(&used, memory_order_relaxed), 0))
        atomic_store(&used, true);
    pt_lock();
    unsigned sl = slot(ordinal);
    shim_pt_counters *c = &counters[f][sl];
    seen[f][sl] = true;
    c->allocs++;
    c->bytes += size;
    if (c->bytes > c->peak_bytes)
        c->peak_bytes = c->bytes;
    uint64_t seq = shim_device_seq_next();
    pt_slot *s = insert_slot(f, ptr);
    if (__builtin_expect(s != NULL, 1)) {
        /* Without a slot (the table full, its rebuild out of memory) the
         * bytes are still counted; the free of an unrecorded pointer then
         * cannot take them off: counted as live until exit, the safe side
         * for a limit-free family. Field by field: a compound literal is
         * a zeroing `rep stos` first, whose start costs more than the
         * stores. */
        s->ptr = ptr;
        s->size = size;
        s->charged = charged;
        s->seq = seq;
        s->refs = 1;
        s->ordinal = ordinal;
        s->device = device;
        s->native_stack = ns;
        s->python_stack = ps;
        s->state = SLOT_LIVE;
        s->family = (uint8_t)f;
        s->released = 0;
        s->maps = NULL;
        live_count_add(f, 1);
        nrecords++;
    }
    unsigned want = rebuild_bits();
    pt_unlock();
    if (__builtin_expect(want != 0, 0))
        rebuild(want);
    shim_pt_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(true, f, on_device(f) ? device : -1, seq, ptr, size, ns, ps);
}

void shim_passthrough_add(enum shim_pt_family f, int ordinal, uintptr_t ptr, size_t size)
{
    if ((unsigned)f < SHIM_PT_FAMILIES)
        add_record(f, ordinal, -1, ptr, size, NULL);
}

void shim_passthrough_add_pooled(enum shim_pt_family f, int ordinal, int device,
                                 shim_arena_pool *pool, uintptr_t ptr, size_t size)
{
    if ((unsigned)f < SHIM_PT_FAMILIES)
        add_record(f, ordinal, device, ptr, size, pool);
}

/* A slot's record as shim_passthrough_live copies it. */
static void to_record(const pt_slot *s, shim_pt_record *r)
{
    const pt_maps *m = s->maps;
    *r = (shim_pt_record){
        .ptr = s->ptr,
        .size = s->size,
        .refs = s->refs,
        .charged = s->charged,
        .family = (enum shim_pt_family)s->family,
        .ordinal = s->ordinal,
        .seq = s->seq,
        .native_stack = s->native_stack,
        .python_stack = s->python_stack,
        .device = s->device,
        .va = m && m->n ? m->v[m->n - 1].va : 0,
        .va_size = m && m->n ? m->v[m->n - 1].size : 0,
        .maps = m ? m->n : 0,
        .released = s->released,
    };
}

/* A record gone from the table (pt_mu not held; its counters and charge
 * were settled under it, count_free): the trace told. */
static void record_gone(const shim_pt_record *r, uint64_t seq)
{
    shim_pt_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(false, r->family, shim_passthrough_reported_device(r), seq, r->ptr, r->size,
           r->native_stack, r->python_stack);
}

/* Takes `s` out of the counters and gives its charge back; pt_mu held
 * (the pool is atomics, a leaf; the bytes freed are counted after the
 * give, so that whoever sees them freed finds them in the pool). */
__attribute__((always_inline)) static inline void count_free(const pt_slot *s)
{
    shim_pt_counters *c = &counters[s->family][slot(s->ordinal)];
    c->frees++;
    c->bytes -= s->size;
    live_count_add((enum shim_pt_family)s->family, -1);
    nrecords--;
    if (s->charged) {
        shim_pool_give(s->charged, s->size);
        uint64_t v =
            atomic_load_explicit(&shim_pressure_watched_freed, memory_order_relaxed) + s->size;
        atomic_store_explicit(&shim_pressure_watched_freed, v, memory_order_relaxed);
    }
}

/* What the trace needs of a record removed under pt_mu, copied there
 * only while a trace is on (its slot may be reused at once). */
static bool traced(void)
{
    return atomic_load_explicit(&event_hook, memory_order_relaxed) != NULL;
}

/* A record removed (pt_mu held): counted freed, copied to *copy with a
 * free's sequence number when `tell`, its slot vacated. Returns its list
 * of mappings, to be freed after the lock. */
__attribute__((always_inline)) static inline pt_maps *take(pt_slot *s, bool tell,
                                                          shim_pt_record *copy)
{
    pt_maps *maps = s->maps;
    s->maps = NULL;
    count_free(s);
    if (tell) {
        to_record(s, copy);
        copy->seq = shim_device_seq_next();
    }
    vacate(s);
    return maps;
}

bool shim_passthrough_remove(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    shim_pt_record copy;
    pt_maps *maps = NULL;
    bool tell = traced();
    pt_lock();
    /* The oldest record of ptr: the free is told after the driver's, and
     * by then another thread may have been given the same address again
     * and recorded it (a stream-ordered pool reuses a block at once); the
     * record that goes is the one the free ended. */
    pt_slot *s = find(f, ptr, true, ANY);
    if (s)
        maps = take(s, tell, &copy);
    pt_unlock();
    if (!s)
        return false;
    free(maps);
    if (tell)
        record_gone(&copy, copy.seq);
    return true;
}

bool shim_passthrough_retain(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    pt_lock();
    pt_slot *s = find(f, ptr, false, ANY);
    if (s)
        s->refs++;
    pt_unlock();
    return s != NULL;
}

long shim_passthrough_unref(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return -1;
    shim_pt_record copy;
    pt_maps *maps = NULL;
    long left = -1;
    bool tell = traced();
    pt_lock();
    /* The newest record of ptr: the program holds that one; an older one
     * is an object whose last release the shim did not see (a leak, as
     * far as it knows). */
    pt_slot *s = find(f, ptr, false, ANY);
    if (s) {
        left = (long)--s->refs;
        if (left == 0)
            maps = take(s, tell, &copy);
    }
    pt_unlock();
    if (left == 0) {
        if (__builtin_expect(maps != NULL, 0))
            free(maps);
        if (tell)
            record_gone(&copy, copy.seq);
    }
    return left;
}

void shim_passthrough_mapped(enum shim_pt_family f, uintptr_t ptr, uintptr_t va, size_t size)
{
    /* VMM's only. */
    if (f != SHIM_PT_VMM || !shim_passthrough_any(f))
        return;
    /* The record's list grows outside pt_mu (a leaf: no allocation under
     * it): look, grow, look again. */
    pt_maps *spare = NULL;
    for (;;) {
        pt_lock();
        pt_slot *s = find(f, ptr, false, NOT_RELEASED);
        pt_maps *m = s ? s->maps : NULL;
        unsigned n = m ? m->n : 0, cap = m ? m->cap : 0;
        if (s && n == cap && spare && spare->cap > n) {
            for (unsigned i = 0; i < n; i++)
                spare->v[i] = m->v[i];
            spare->n = n;
            s->maps = spare;
            spare = m;
            m = s->maps;
            cap = m->cap;
        }
        bool room = s && n < cap;
        if (room)
            m->v[m->n++] = (pt_map){va, size};
        unsigned want = s && !room ? 2 * cap + 2 : 0;
        pt_unlock();
        if (!want)
            break;
        free(spare);
        spare = malloc(sizeof *spare + want * sizeof(pt_map));
        if (!spare)
            break; /* out of host memory: the mapping is not recorded */
        spare->cap = want;
        spare->n = 0;
    }
    free(spare);
}

/* Removes every record of `f` that `pick` chooses, a batch at a time
 * (their copies on the stack: nothing is allocated under pt_mu), each
 * told to the trace as freed after the lock. Returns how many went. */
#define DROP_BATCH 64
static size_t drop_where(enum shim_pt_family f, bool (*pick)(pt_slot *s, void *arg), void *arg)
{
    size_t total = 0, at = 0;
    uint64_t removals = 0;
    for (;;) {
        struct {
            shim_pt_record r;
            pt_maps *maps;
        } out[DROP_BATCH];
        size_t k = 0;
        pt_lock();
        /* Records moved since the last batch (a removal moves records
         * back, a rebuild all of them): again from the start (pick is
         * idempotent: what it chose went, what it changed it does not
         * choose again). */
        if (nremovals != removals)
            at = 0;
        size_t n = table_mask() + 1;
        while (at < n && k < DROP_BATCH) {
            pt_slot *s = &table[at];
            if (s->state == SLOT_LIVE && s->family == f && pick(s, arg)) {
                /* A record may move into `at` (vacate): looked at next;
                 * one from the array's start, before it, may be looked at
                 * twice. */
                out[k].maps = take(s, true, &out[k].r);
                k++;
            } else {
                at++;
            }
        }
        bool done = at >= n;
        removals = nremovals;
        pt_unlock();
        for (size_t i = 0; i < k; i++) {
            record_gone(&out[i].r, out[i].r.seq);
            free(out[i].maps);
        }
        total += k;
        if (done)
            return total;
    }
}

struct range {
    uintptr_t va;
    size_t size;
};

/* Every mapping of the record starting in the range goes (the driver
 * unmaps whole mappings); the record too once released and unmapped
 * everywhere. */
static bool unmapped_in(pt_slot *s, void *arg)
{
    const struct range *g = arg;
    pt_maps *m = s->maps;
    if (!m)
        return false;
    unsigned kept = 0;
    bool hit = false;
    for (unsigned i = 0; i < m->n; i++) {
        if (m->v[i].va >= g->va && m->v[i].va - g->va < g->size)
            hit = true;
        else
            m->v[kept++] = m->v[i];
    }
    if (!hit)
        return false;
    m->n = kept;
    return s->released && kept == 0;
}

size_t shim_passthrough_unmapped(enum shim_pt_family f, uintptr_t va, size_t size)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return 0;
    struct range g = {va, size};
    return drop_where(f, unmapped_in, &g);
}

bool shim_passthrough_release(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    shim_pt_record copy;
    pt_maps *maps = NULL;
    bool gone = false, tell = traced();
    pt_lock();
    pt_slot *s = find(f, ptr, false, WITH_REFS);
    if (s) {
        s->released = --s->refs == 0;
        if (s->released && !(s->maps && s->maps->n)) {
            maps = take(s, tell, &copy);
            gone = true;
        }
    }
    pt_unlock();
    if (gone) {
        free(maps);
        if (tell)
            record_gone(&copy, copy.seq);
    }
    return s != NULL;
}

void shim_passthrough_retained(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return;
    pt_lock();
    pt_slot *s = find(f, ptr, false, WITH_REFS_OR_MAPS);
    if (s) {
        s->refs++;
        s->released = false;
    }
    pt_unlock();
}

static bool charged_to(pt_slot *s, void *pool)
{
    return s->charged == pool;
}

size_t shim_passthrough_drop_pool(enum shim_pt_family f, shim_arena_pool *pool)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !pool || !shim_passthrough_any(f))
        return 0;
    return drop_where(f, charged_to, pool);
}

bool shim_passthrough_contains(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    pt_lock();
    bool found = find(f, ptr, false, ANY) != NULL;
    pt_unlock();
    return found;
}

bool shim_passthrough_used(void)
{
    return atomic_load(&used);
}

void shim_passthrough_totals(enum shim_pt_family f, shim_pt_counters *out)
{
    *out = (shim_pt_counters){0};
    if ((unsigned)f >= SHIM_PT_FAMILIES)
        return;
    pt_lock();
    for (unsigned i = 0; i <= ORDINALS; i++) {
        out->bytes += counters[f][i].bytes;
        out->peak_bytes += counters[f][i].peak_bytes; /* the sum of each device's peak */
        out->allocs += counters[f][i].allocs;
        out->frees += counters[f][i].frees;
    }
    pt_unlock();
}

void shim_passthrough_each(void (*fn)(void *arg, enum shim_pt_family f, int ordinal,
                                      const shim_pt_counters *c),
                           void *arg)
{
    shim_pt_counters copy[SHIM_PT_FAMILIES][ORDINALS + 1];
    bool had[SHIM_PT_FAMILIES][ORDINALS + 1];
    pt_lock();
    for (unsigned f = 0; f < SHIM_PT_FAMILIES; f++)
        for (unsigned i = 0; i <= ORDINALS; i++) {
            copy[f][i] = counters[f][i];
            had[f][i] = seen[f][i];
        }
    pt_unlock();
    for (unsigned f = 0; f < SHIM_PT_FAMILIES; f++)
        for (unsigned i = 0; i <= ORDINALS; i++)
            if (had[f][i])
                fn(arg, (enum shim_pt_family)f, (int)i - 1, &copy[f][i]);
}

shim_pt_record *shim_passthrough_live(uint64_t since, size_t *n)
{
    *n = 0;
    size_t cap = 0;
    for (unsigned f = 0; f < SHIM_PT_FAMILIES; f++)
        cap += atomic_load(&shim_pt_live_count[f]);
    if (cap == 0)
        return NULL;
    cap += 64; /* records added while copying beyond this are left out */
    shim_pt_record *out = malloc(cap * sizeof *out);
    if (!out) {
        *n = cap;
        return NULL;
    }
    size_t k = 0;
    pt_lock();
    for (size_t i = 0, m = table_mask(); i <= m && k < cap; i++)
        if (table[i].state == SLOT_LIVE && table[i].seq > since)
            to_record(&table[i], &out[k++]);
    pt_unlock();
    *n = k;
    if (k == 0) {
        free(out);
        return NULL;
    }
    return out;
}

void shim_passthrough_atfork_prepare(void)
{
    pt_lock();
}

void shim_passthrough_atfork_parent(void)
{
    pt_unlock();
}

void shim_passthrough_atfork_child(void)
{
    pt_unlock();
}
