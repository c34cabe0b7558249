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
 * sequence) in a chained hash table of nodes from a slab (slab.h), and
 * the counters per family and device. One lock, pt_mu, guards them; it
 * is a leaf: nothing is called with it held but malloc-free bookkeeping
 * (docs/locking.md). Stacks are captured before it is taken, on the
 * allocating thread. Each record's add and each free take it once: an
 * OpenCL create and release pair, a hundred nanoseconds in the runtime,
 * pays two round trips, so it is a word taken with one exchange and
 * released with a plain store (a pthread mutex's release is a second
 * locked instruction), waited on by spinning, then yielding: what it
 * guards is a few dozen instructions that never block. The common add
 * and release make no call at all (bench/opencl_pair.sh, docs/opencl.md's
 * cost).
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
#include "seq.h"
#include "slab.h"

#define FIRST_BITS 10 /* 1,024 buckets to begin with (static: no malloc at the first record) */
#define ORDINALS 64 /* device ordinals counted one by one; slot 0 is the host (-1) */

/* A mapping of a VMM handle; a handle may be mapped at several addresses
 * at once, and its memory lives while any is. */
typedef struct pt_map {
    uintptr_t va;
    uint64_t size;
} pt_map;

/* From the slab (slab.h), two cache lines with its word: the fields a
 * release reads (the link, the counters, the record's first ones) are the
 * first line. */
typedef struct node {
    struct node *next;
    struct shim_pt_counters *ctr; /* its family's and device's counters */
    shim_pt_record r;
    pt_map *mapv; /* r.maps of them, live (VMM) */
    unsigned capv;
} node;

_Static_assert(offsetof(node, r.charged) + sizeof(void *) <= 64 &&
                   offsetof(node, r.ordinal) + sizeof(int) <= 64,
               "what a release reads is on the node's first line");
_Static_assert(sizeof(node) + sizeof(void *) <= 128, "a node and the slab's word: two lines");

/* pt_mu: 0 free, 1 held (see the header comment). The one lock of ours
 * not counted in the thread's shim locks (mutex.h): that count is there
 * to catch a loader call, a stack capture or an interpreter look made
 * under a lock of ours, and nothing under pt_mu calls anything but this
 * file's bookkeeping (docs/locking.md); it cost two thread-local updates
 * a record (docs/opencl.md, "Cost"). */
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

/* pt_mu taken if it is free, without waiting: the paths that make no
 * call (and so save no registers) try, and go the general way on a busy
 * lock. */
static inline bool pt_trylock(void)
{
    /* One thread: nothing else can take it between the load and the
     * store (shim_single_threaded), and a locked exchange would be a full
     * barrier on each record. */
    if (shim_single_threaded() && atomic_load_explicit(&pt_mu, memory_order_relaxed) == 0)
        atomic_store_explicit(&pt_mu, 1, memory_order_relaxed);
    else if (atomic_exchange_explicit(&pt_mu, 1, memory_order_acquire) != 0)
        return false;
    return true;
}

static inline void pt_lock(void)
{
    if (!pt_trylock())
        pt_wait();
}

static inline void pt_unlock(void)
{
    atomic_store_explicit(&pt_mu, 0, memory_order_release);
}

/* The buckets (pt_mu): `nbuckets`, a power of two, doubled (grow) while
 * the records outnumber half of them, so that a free walks a chain of
 * about one node whatever the number of live objects (each node a likely
 * cache miss: a free's main cost, bench/opencl_pair.sh). Never shrunk. */
static node *first_table[1u << FIRST_BITS];
static node **table = first_table;
static unsigned table_bits = FIRST_BITS;
static unsigned table_shift = 64 - FIRST_BITS; /* bucket's, 64 - table_bits */
/* The nodes (pt_mu): those of removed records are the next ones'. The
 * fields of VMM's mappings (va, maps, released, mapv, capv) are zero in
 * every free node (a new block's are, put_node zeroes a VMM node's), so
 * that a record's creation leaves them alone. */
static shim_slab_cache nodes = SHIM_SLAB_CACHE_INIT(sizeof(node));
/* Records past it: the table doubles (half of its buckets, grow). */
static size_t grow_at = (1u << FIRST_BITS) / 2;
/* By device slot, then family: an account keeps its slot's row (account_of). */
static shim_pt_counters counters[ORDINALS + 1][SHIM_PT_FAMILIES];
_Atomic uint64_t shim_pt_live_count[SHIM_PT_FAMILIES];
/* The next record's order (written under pt_mu; read without it by a
 * hook before a runtime call: shim_passthrough_order). */
_Atomic uint32_t shim_pt_order;
static atomic_bool used;
static _Atomic(shim_pt_capture_fn) capture;
static _Atomic(shim_pt_event_fn) pt_event_hook;
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

/* Whether either hook is set: a record's first look, one load. */
static _Atomic bool hooked;

static void note_hooks(void)
{
    atomic_store(&hooked, atomic_load(&capture) || atomic_load(&pt_event_hook));
}

void shim_passthrough_set_capture(shim_pt_capture_fn fn)
{
    atomic_store(&capture, fn);
    note_hooks();
}

void shim_passthrough_set_event_hook(shim_pt_event_fn fn)
{
    atomic_store(&pt_event_hook, fn);
    note_hooks();
}

void shim_passthrough_set_trim_hook(shim_pt_trim_fn fn)
{
    atomic_store(&trim_hook, fn);
}

void shim_passthrough_pool_trimmed(uintptr_t pool, size_t released)
{
    shim_pt_trim_fn fn = atomic_load(&trim_hook);
    if (fn)
        fn(seq_take(), pool, released);
}

static unsigned bucket(uintptr_t ptr)
{
    return (unsigned)((ptr >> 4) * 0x9E3779B97F4A7C15ull >> table_shift);
}

/* Written under pt_mu only, read without it: a plain load and store, no
 * locked instruction on the path of every record. */
static void live_count_add(enum shim_pt_family f, int delta)
{
    uint64_t v = atomic_load_explicit(&shim_pt_live_count[f], memory_order_relaxed);
    atomic_store_explicit(&shim_pt_live_count[f], v + (uint64_t)(int64_t)delta,
                          memory_order_relaxed);
}

/* The counters' slot of a device ordinal: 0 for the host (-1), ordinals
 * past ORDINALS share the last slot (counted, not told apart). */
static unsigned slot(int ordinal)
{
    unsigned s = (unsigned)ordinal + 1;
    return s < ORDINALS ? s : ORDINALS;
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

/* The table doubled to 2^bits buckets, the records moved (pt_mu not
 * held: the new array is had before the lock, the old one freed after
 * it). Out of memory, or another thread was first: nothing changes. */
__attribute__((noinline, cold)) static void grow(unsigned bits)
{
    if (bits > 30)
        return;
    node **fresh = calloc((size_t)1 << bits, sizeof *fresh);
    if (!fresh)
        return;
    node **old = NULL;
    pt_lock();
    if (table_bits < bits) {
        unsigned nold = 1u << table_bits;
        old = table;
        table = fresh;
        table_bits = bits;
        table_shift = 64 - bits;
        grow_at = ((size_t)1 << bits) / 2;
        for (unsigned b = 0; b < nold; b++) {
            /* Kept in their order (oldest last: remove and unref rely on
             * it): each chain appended at its new buckets' tails. */
            for (node *x = old[b], *next; x; x = next) {
                next = x->next;
                node **at = &table[bucket(x->r.ptr)];
                while (*at)
                    at = &(*at)->next;
                x->next = NULL;
                *at = x;
            }
        }
        fresh = NULL;
    }
    pt_unlock();
    free(fresh);
    if (old != first_table)
        free(old);
}

/* A node for a new record, pt_mu held: a free one, or (none left) one of
 * a new block had with the lock let go meanwhile (a leaf: no allocation
 * under it); NULL when out of host memory. */
static node *take_node(void)
{
    node *n = shim_slab_pop(&nodes);
    if (n)
        return n;
    pt_unlock();
    void *block = shim_slab_new(&nodes);
    pt_lock();
    if (block)
        shim_slab_add(&nodes, block);
    return shim_slab_pop(&nodes);
}

/* A new record in node `n` (NULL: out of host memory) on account `a`,
 * counted; pt_mu held. */
__attribute__((always_inline)) static inline void insert(node *n, enum shim_pt_family f,
                                                        const shim_pt_account *a, uintptr_t ptr,
                                                        size_t size, uint64_t seq, uint32_t ns,
                                                        uint32_t ps)
{
    shim_pt_counters *c = &a->row[f];
    c->allocs++;
    c->bytes += size;
    if (c->bytes > c->peak_bytes)
        c->peak_bytes = c->bytes;
    /* Without a node the bytes are still counted; the free of an
     * unrecorded pointer then cannot take them off: counted as live until
     * exit, the safe side for a limit-free family. */
    if (__builtin_expect(n == NULL, 0))
        return;
    /* Field by field: a compound literal is a zeroing `rep stos` first,
     * whose start costs more than the stores; VMM's fields are already
     * zero (nodes). */
    n->ctr = c;
    shim_pt_record *r = &n->r;
    r->ptr = ptr;
    r->size = size;
    r->refs = 1;
    r->order = atomic_load_explicit(&shim_pt_order, memory_order_relaxed);
    atomic_store_explicit(&shim_pt_order, r->order + 1, memory_order_relaxed);
    r->charged = a->pool;
    r->family = f;
    r->ordinal = a->ordinal;
    r->seq = seq;
    r->native_stack = ns;
    r->python_stack = ps;
    r->device = a->index;
    node **head = &table[bucket(ptr)];
    n->next = *head;
    *head = n;
    live_count_add(f, 1);
}

/* The records of every family (pt_mu held): the general way's look at
 * the table's growth, not each record's. */
static size_t records(void)
{
    size_t n = 0;
    for (unsigned f = 0; f < SHIM_PT_FAMILIES; f++)
        n += atomic_load_explicit(&shim_pt_live_count[f], memory_order_relaxed);
    return n;
}

/* A record added the general way: stacks captured, the trace told, a
 * wait for the lock, a node malloc'd, the table grown. */
__attribute__((noinline)) static uintptr_t add_record(enum shim_pt_family f,
                                                      const shim_pt_account *a, uintptr_t ptr,
                                                      size_t size)
{
    shim_pt_capture_fn cap = atomic_load_explicit(&capture, memory_order_relaxed);
    uint32_t ns = 0, ps = 0;
    if (cap)
        cap(&ns, &ps);
    if (!atomic_load_explicit(&used, memory_order_relaxed))
        atomic_store(&used, true);
    pt_lock();
    node *n = take_node();
    uint64_t seq = seq_take();
    insert(n, f, a, ptr, size, seq, ns, ps);
    bool grow_now = records() > grow_at;
    unsigned grow_to = table_bits + 1;
    pt_unlock();
    if (grow_now)
        grow(grow_to);
    shim_pt_event_fn ev = atomic_load_explicit(&pt_event_hook, memory_order_relaxed);
    if (ev)
        ev(true, f, on_device(f) ? a->index : -1, seq, ptr, size, ns, ps);
    return ptr;
}

/* Each add: without a call where it can (so without saving a register:
 * a watched OpenCL create is a few hundred instructions in the runtime,
 * docs/opencl.md, "Cost"): no stacks to capture, no trace, a number from
 * the thread's batch (no trace: `hooked` covers the trace, which sets
 * both its hooks), the lock free, a free node; the general way
 * (add_record) from the start otherwise. The first record goes the
 * general way (no block yet), so `used` is set already; the table's
 * growth is looked at by the general way (at least once a block's worth
 * of records: the table is at most that many records late in doubling). */
__attribute__((always_inline)) static inline uintptr_t add(enum shim_pt_family f,
                                                          const shim_pt_account *a,
                                                          uintptr_t ptr, size_t size)
{
    uint64_t seq;
    if (__builtin_expect(!atomic_load_explicit(&hooked, memory_order_relaxed) &&
                             seq_try_untraced(&seq) && pt_trylock(),
                         1)) {
        node *n = shim_slab_pop(&nodes);
        if (__builtin_expect(n != NULL, 1)) {
            insert(n, f, a, ptr, size, seq, 0, 0);
            pt_unlock();
            return ptr;
        }
        pt_unlock();
    }
    return add_record(f, a, ptr, size); /* ptr, so that this is a jump */
}

shim_pt_account shim_passthrough_account_of(int ordinal, int device, shim_arena_pool *pool)
{
    return (shim_pt_account){.pool = pool, .ordinal = ordinal, .index = device,
                             .row = counters[slot(ordinal)]};
}

void shim_passthrough_add(enum shim_pt_family f, int ordinal, uintptr_t ptr, size_t size)
{
    shim_passthrough_add_pooled(f, ordinal, -1, NULL, ptr, size);
}

void shim_passthrough_add_pooled(enum shim_pt_family f, int ordinal, int device,
                                 shim_arena_pool *pool, uintptr_t ptr, size_t size)
{
    shim_pt_account a = shim_passthrough_account_of(ordinal, device, pool);
    if ((unsigned)f < SHIM_PT_FAMILIES)
        add(f, &a, ptr, size);
}

uintptr_t shim_passthrough_add_to(enum shim_pt_family f, const shim_pt_account *a,
                                  uintptr_t ptr, size_t size)
{
    /* OpenCL's buffers, the family a constant there (its counters and
     * count at fixed places): each create of a watched buffer. */
    if (f == SHIM_PT_OPENCL_MEM)
        return add(SHIM_PT_OPENCL_MEM, a, ptr, size);
    return add(f, a, ptr, size);
}

/* A record gone from the table (pt_mu not held; its counters and charge
 * were settled under it, count_free): the trace told. */
static void record_gone(const shim_pt_record *r, uint64_t seq)
{
    shim_pt_event_fn ev = atomic_load_explicit(&pt_event_hook, memory_order_relaxed);
    if (ev)
        ev(false, r->family, shim_passthrough_reported_device(r), seq, r->ptr, r->size,
           r->native_stack, r->python_stack);
}

/* `n`, unlinked and counted off, back to the slab, its mappings' fields
 * zeroed (pt_mu held). Returns its list of mappings, for the caller to
 * free once pt_mu is let go (VMM's; NULL for the others). */
static pt_map *put_node(node *n)
{
    pt_map *mapv = n->mapv;
    if (__builtin_expect(n->r.family == SHIM_PT_VMM, 0)) {
        n->r.va = 0;
        n->r.va_size = 0;
        n->r.maps = 0;
        n->r.released = false;
        n->mapv = NULL;
        n->capv = 0;
    }
    shim_slab_push(&nodes, n);
    return mapv;
}

/* The slab's blocks swept when a sweep is due (pt_mu held): for
 * shim_slab_free_blocks once it is let go. */
static void *sweep_if_due(void)
{
    return shim_slab_sweep_due(&nodes) ? shim_slab_sweep(&nodes) : NULL;
}

/* Takes `n` out of the counters and gives its charge back; pt_mu held
 * (the pool is atomics, a leaf; the bytes freed are counted after the
 * give, so that whoever sees them freed finds them in the pool). */
__attribute__((always_inline)) static inline void count_free(const node *n)
{
    shim_pt_counters *c = n->ctr;
    c->frees++;
    c->bytes -= n->r.size;
    live_count_add(n->r.family, -1);
    if (n->r.charged) {
        shim_pool_give(n->r.charged, n->r.size);
        uint64_t v =
            atomic_load_explicit(&shim_pressure_watched_freed, memory_order_relaxed) + n->r.size;
        atomic_store_explicit(&shim_pressure_watched_freed, v, memory_order_relaxed);
    }
}

/* What the trace needs of a record unlinked under pt_mu, copied there
 * only while a trace is on (a node back in the slab is reused at once). */
static bool traced(void)
{
    return atomic_load_explicit(&pt_event_hook, memory_order_relaxed) != NULL;
}

/* What is left to do of a record unlinked under pt_mu once it is let go
 * (unlink_at, gone_after). */
typedef struct gone {
    shim_pt_record copy; /* for the trace, while one is on */
    uint64_t seq;
    bool tell;
    pt_map *mapv;        /* its mappings, to free */
    void *swept;         /* the slab's blocks, to free */
} gone;

/* The record at `at` unlinked (pt_mu held): counted off, copied for the
 * trace while one is on (its node is reused at once), its node back to
 * the slab. */
static void unlink_at(node **at, gone *g)
{
    node *x = *at;
    *at = x->next;
    count_free(x);
    g->tell = traced();
    g->seq = g->tell ? seq_take() : 0;
    if (g->tell)
        g->copy = x->r;
    g->mapv = put_node(x);
    g->swept = sweep_if_due();
}

static void gone_after(const gone *g)
{
    free(g->mapv);
    shim_slab_free_blocks(g->swept);
    if (g->tell)
        record_gone(&g->copy, g->seq);
}

bool shim_passthrough_remove(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    pt_lock();
    /* The oldest record of ptr (records go in at the head): the free is
     * told after the driver's, and by then another thread may have been
     * given the same address again and recorded it (a stream-ordered pool
     * reuses a block at once); the record that goes is the one the free
     * ended. */
    node **at = NULL;
    for (node **p = &table[bucket(ptr)]; *p; p = &(*p)->next)
        if ((*p)->r.ptr == ptr && (*p)->r.family == f)
            at = p;
    gone g;
    if (at)
        unlink_at(at, &g);
    pt_unlock();
    if (!at)
        return false;
    gone_after(&g);
    return true;
}

bool shim_passthrough_retain(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    bool found = false;
    pt_lock();
    for (node *p = table[bucket(ptr)]; p && !found; p = p->next)
        if (p->r.ptr == ptr && p->r.family == f) {
            p->r.refs++;
            found = true;
        }
    pt_unlock();
    return found;
}

/* A record whose last reference went, at `at` (pt_mu held), unlinked
 * the general way (unlink_at: told to the trace, a VMM node's mappings
 * freed, the slab swept); pt_mu released. Returns 0, the references
 * left. */
__attribute__((noinline)) static long unref_gone(node **at)
{
    gone g;
    unlink_at(at, &g);
    pt_unlock();
    gone_after(&g);
    return 0;
}

/* unref with pt_mu held (released on return), of the newest record of
 * `ptr` that went in before `order`. Without a call where it can, as
 * add: the last reference of a record with no trace to tell and no sweep
 * due costs no register saved. */
__attribute__((always_inline)) static inline long unref_held(enum shim_pt_family f,
                                                            uintptr_t ptr, uint32_t order)
{
    /* The newest such record (records go in at the head): the program
     * holds that one; an older one is an object whose last release the
     * shim did not see (a leak, as far as it knows); a newer one is
     * another's, made at the address since the runtime freed this one
     * (unref_before). Orders wrap: compared by their difference. */
    for (node **p = &table[bucket(ptr)], *x; (x = *p) != NULL; p = &x->next) {
        if (x->r.ptr != ptr || x->r.family != f || (int32_t)(x->r.order - order) >= 0)
            continue;
        long left = (long)--x->r.refs;
        if (left != 0) {
            pt_unlock();
            return left;
        }
        if (__builtin_expect(traced() || f == SHIM_PT_VMM || nodes.nfree >= nodes.sweep_at, 0))
            return unref_gone(p);
        *p = x->next;
        count_free(x);
        shim_slab_push(&nodes, x);
        pt_unlock();
        return 0;
    }
    pt_unlock();
    return -1;
}

__attribute__((noinline)) static long unref_wait(enum shim_pt_family f, uintptr_t ptr,
                                                 uint32_t order)
{
    pt_lock();
    return unref_held(f, ptr, order);
}

long shim_passthrough_unref_before(enum shim_pt_family f, uintptr_t ptr, uint32_t order)
{
    if (__builtin_expect(!pt_trylock(), 0))
        return unref_wait(f, ptr, order);
    /* As add_to: each release of a watched OpenCL buffer. */
    if (f == SHIM_PT_OPENCL_MEM)
        return unref_held(SHIM_PT_OPENCL_MEM, ptr, order);
    return unref_held(f, ptr, order);
}

void shim_passthrough_mapped(enum shim_pt_family f, uintptr_t ptr, uintptr_t va, size_t size)
{
    /* VMM's only (put_node clears a list of mappings there alone). */
    if (f != SHIM_PT_VMM || !shim_passthrough_any(f))
        return;
    /* The record's list grows outside pt_mu (a leaf: no allocation under
     * it): look, grow, look again. */
    pt_map *spare = NULL;
    unsigned spare_cap = 0;
    for (;;) {
        node *p = NULL;
        pt_lock();
        for (p = table[bucket(ptr)]; p; p = p->next)
            if (p->r.ptr == ptr && p->r.family == f && !p->r.released)
                break;
        if (p && p->r.maps == p->capv && spare_cap > p->r.maps) {
            for (unsigned i = 0; i < p->r.maps; i++)
                spare[i] = p->mapv[i];
            pt_map *old = p->mapv;
            p->mapv = spare;
            p->capv = spare_cap;
            spare = old;
        }
        bool room = p && p->r.maps < p->capv;
        if (room) {
            p->mapv[p->r.maps++] = (pt_map){va, size};
            p->r.va = va;
            p->r.va_size = size;
        }
        unsigned want = p && !room ? 2 * p->capv + 2 : 0;
        pt_unlock();
        if (!want)
            break;
        free(spare);
        spare = malloc(want * sizeof *spare);
        spare_cap = spare ? want : 0;
        if (!spare)
            break; /* out of host memory: the mapping is not recorded */
    }
    free(spare);
}

/* Unlinks every record of `f` that `pick` chooses into a list (the node's
 * next), with its counters taken off and a free's sequence number in its
 * seq; pt_mu held. */
static node *unlink_where(enum shim_pt_family f, bool (*pick)(node *x, void *arg),
                          void *arg, size_t *n)
{
    node *out = NULL;
    for (unsigned b = 0; b < (1u << table_bits); b++) {
        for (node **p = &table[b]; *p;) {
            node *x = *p;
            if (x->r.family == f && pick(x, arg)) {
                *p = x->next;
                count_free(x);
                x->r.seq = seq_take();
                x->next = out;
                out = x;
                (*n)++;
            } else {
                p = &x->next;
            }
        }
    }
    return out;
}

/* unlink_where's list told to the trace, then its nodes back to the
 * slab (pt_mu not held: taken for that). */
static void gone_list(node *list)
{
    if (!list)
        return;
    for (node *x = list; x; x = x->next) {
        record_gone(&x->r, x->r.seq);
        free(x->mapv); /* unlinked: the node is no one else's */
        x->mapv = NULL;
    }
    pt_lock();
    for (node *x = list, *next; x; x = next) {
        next = x->next;
        put_node(x);
    }
    void *swept = sweep_if_due();
    pt_unlock();
    shim_slab_free_blocks(swept);
}

struct range {
    uintptr_t va;
    size_t size;
};

/* Every mapping of the record starting in the range goes (the driver
 * unmaps whole mappings); the record too once released and unmapped
 * everywhere. */
static bool unmapped_in(node *x, void *arg)
{
    const struct range *g = arg;
    shim_pt_record *r = &x->r;
    unsigned kept = 0;
    bool hit = false;
    for (unsigned i = 0; i < r->maps; i++) {
        if (x->mapv[i].va >= g->va && x->mapv[i].va - g->va < g->size)
            hit = true;
        else
            x->mapv[kept++] = x->mapv[i];
    }
    if (!hit)
        return false;
    r->maps = kept;
    r->va = kept ? x->mapv[kept - 1].va : 0;
    r->va_size = kept ? x->mapv[kept - 1].size : 0;
    return r->released && r->maps == 0;
}

size_t shim_passthrough_unmapped(enum shim_pt_family f, uintptr_t va, size_t size)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return 0;
    struct range g = {va, size};
    size_t n = 0;
    pt_lock();
    node *dead = unlink_where(f, unmapped_in, &g, &n);
    pt_unlock();
    gone_list(dead);
    return n;
}

bool shim_passthrough_release(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    bool kept = false, found = false;
    pt_lock();
    for (node *p = table[bucket(ptr)]; p && !found; p = p->next)
        if (p->r.ptr == ptr && p->r.family == f && p->r.refs) {
            found = true;
            p->r.released = --p->r.refs == 0;
            kept = !p->r.released || p->r.maps;
        }
    pt_unlock();
    return found && (kept || shim_passthrough_remove(f, ptr));
}

void shim_passthrough_retained(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return;
    pt_lock();
    for (node *p = table[bucket(ptr)]; p; p = p->next)
        if (p->r.ptr == ptr && p->r.family == f && (p->r.refs || p->r.maps)) {
            p->r.refs++;
            p->r.released = false;
            break;
        }
    pt_unlock();
}

static bool charged_to(node *x, void *pool)
{
    return x->r.charged == pool;
}

size_t shim_passthrough_drop_pool(enum shim_pt_family f, shim_arena_pool *pool)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !pool || !shim_passthrough_any(f))
        return 0;
    size_t n = 0;
    pt_lock();
    node *dropped = unlink_where(f, charged_to, pool, &n);
    pt_unlock();
    gone_list(dropped);
    return n;
}

bool shim_passthrough_contains(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    bool found = false;
    pt_lock();
    for (node *p = table[bucket(ptr)]; p && !found; p = p->next)
        found = p->r.ptr == ptr && p->r.family == f;
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
        out->bytes += counters[i][f].bytes;
        out->peak_bytes += counters[i][f].peak_bytes; /* the sum of each device's peak */
        out->allocs += counters[i][f].allocs;
        out->frees += counters[i][f].frees;
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
            copy[f][i] = counters[i][f];
            had[f][i] = counters[i][f].allocs != 0; /* counters are never reset */
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
    for (unsigned b = 0; b < (1u << table_bits) && k < cap; b++)
        for (node *p = table[b]; p && k < cap; p = p->next)
            if (p->r.seq > since)
                out[k++] = p->r;
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
