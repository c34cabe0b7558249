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
 * sequence) in a chained hash table, and the counters per family and
 * device. One lock, pt_mu, guards both; it is a leaf: nothing is called
 * with it held but malloc-free bookkeeping (docs/locking.md). Stacks are
 * captured before it is taken, on the allocating thread. Each record's
 * add and each free take it once: an OpenCL create and release pair, a
 * hundred nanoseconds in the runtime, pays two round trips, so it is a
 * word taken with one exchange and released with a plain store (a
 * pthread mutex's release is a second locked instruction), waited on by
 * spinning, then yielding: what it guards is a few dozen instructions
 * that never block (bench/opencl_pair.sh, docs/opencl.md's cost).
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

#define FIRST_BITS 10 /* 1,024 buckets to begin with (static: no malloc at the first record) */
#define ORDINALS 64 /* device ordinals counted one by one; slot 0 is the host (-1) */

/* A mapping of a VMM handle; a handle may be mapped at several addresses
 * at once, and its memory lives while any is. */
typedef struct pt_map {
    uintptr_t va;
    uint64_t size;
} pt_map;

/* malloc'd, not aligned to a cache line (aligned_alloc's split chunks
 * slowed the runtime's own small allocations more than a line saves):
 * the fields a free reads (the link, the record's first ones) are 48
 * bytes, on one line or two. */
typedef struct node {
    struct node *next;
    shim_pt_record r;
    pt_map *mapv; /* r.maps of them, live (VMM) */
    unsigned capv;
} node;

static node *node_alloc(void)
{
    return malloc(sizeof(node));
}

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

/* The buckets (pt_mu): `nbuckets`, a power of two, doubled (grow) while
 * the records outnumber half of them, so that a free walks a chain of
 * about one node whatever the number of live objects (each node a likely
 * cache miss: a free's main cost, bench/opencl_pair.sh). Never shrunk. */
static node *first_table[1u << FIRST_BITS];
static node **table = first_table;
static unsigned table_bits = FIRST_BITS;
static size_t nrecords; /* records in the table, all families */
/* Nodes of removed records kept for the next ones (pt_mu): a create and
 * release pair of OpenCL, a few hundred nanoseconds, would otherwise pay a
 * malloc and a free. At most SPARE_MAX; the rest are freed. */
#define SPARE_MAX 1024u
static node *spare;
static unsigned nspare;
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

static unsigned bucket(uintptr_t ptr)
{
    return (unsigned)((ptr >> 4) * 0x9E3779B97F4A7C15ull >> (64 - table_bits));
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

/* Inline in both adds: a create pays no call more. */
__attribute__((always_inline)) static inline void add_record(enum shim_pt_family f, int ordinal,
                                                            int device, uintptr_t ptr,
                                                            size_t size,
                                                            shim_arena_pool *charged)
{
    /* A spare node when there may be one (read without the lock: at worst
     * a malloc too many, or one more look under it). */
    node *n = __atomic_load_n(&nspare, __ATOMIC_RELAXED) ? NULL : node_alloc();
    shim_pt_capture_fn cap = atomic_load_explicit(&capture, memory_order_relaxed);
    uint32_t ns = 0, ps = 0;
    if (cap)
        cap(&ns, &ps);
    if (__builtin_expect(!atomic_load_explicit(&used, memory_order_relaxed), 0))
        atomic_store(&used, true);
    pt_lock();
    if (!n && spare) {
        n = spare;
        spare = n->next;
        __atomic_store_n(&nspare, nspare - 1, __ATOMIC_RELAXED);
    }
    if (__builtin_expect(!n, 0)) { /* taken by another thread meanwhile */
        pt_unlock();
        n = node_alloc();
        pt_lock();
    }
    unsigned sl = slot(ordinal);
    shim_pt_counters *c = &counters[f][sl];
    seen[f][sl] = true;
    c->allocs++;
    c->bytes += size;
    if (c->bytes > c->peak_bytes)
        c->peak_bytes = c->bytes;
    uint64_t seq = shim_device_seq_next();
    if (n) {
        /* Without a node the bytes are still counted; the free of an
         * unrecorded pointer then cannot take them off: counted as live
         * until exit, the safe side for a limit-free family. */
        /* Field by field: a compound literal is a zeroing `rep stos`
         * first, whose start costs more than the stores. */
        shim_pt_record *r = &n->r;
        r->ptr = ptr;
        r->size = size;
        r->refs = 1;
        r->charged = charged;
        r->family = f;
        r->ordinal = ordinal;
        r->seq = seq;
        r->native_stack = ns;
        r->python_stack = ps;
        r->device = device;
        r->va = 0;
        r->va_size = 0;
        r->maps = 0;
        r->released = false;
        n->mapv = NULL;
        n->capv = 0;
        unsigned b = bucket(ptr);
        n->next = table[b];
        table[b] = n;
        live_count_add(f, 1);
        nrecords++;
    }
    unsigned grow_to = nrecords > (1u << table_bits) / 2 ? table_bits + 1 : 0;
    pt_unlock();
    if (__builtin_expect(grow_to != 0, 0))
        grow(grow_to);
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

/* A record gone from the table (pt_mu not held; its counters and charge
 * were settled under it, count_free): the trace told. */
static void record_gone(const shim_pt_record *r, uint64_t seq)
{
    shim_pt_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(false, r->family, shim_passthrough_reported_device(r), seq, r->ptr, r->size,
           r->native_stack, r->python_stack);
}

/* A node and its list of mappings freed (pt_mu not held); NULL: nothing. */
static void node_free(node *n)
{
    if (n) {
        free(n->mapv);
        free(n);
    }
}

/* The same for a node unlinked from the table, which is freed. */
static void gone_record(node *gone, uint64_t seq)
{
    record_gone(&gone->r, seq);
    node_free(gone);
}

/* `n`, unlinked, kept as a spare or freed; pt_mu held. Its record is
 * copied out first by the caller. */
static node *keep_spare(node *n)
{
    /* mapv is on the node's last line: looked at only for the family
     * that has mappings (a free of another touches the first line only). */
    if (nspare >= SPARE_MAX || (n->r.family == SHIM_PT_VMM && n->mapv))
        return n; /* the caller frees it (node_free) after the lock */
    n->next = spare;
    spare = n;
    __atomic_store_n(&nspare, nspare + 1, __ATOMIC_RELAXED);
    return NULL;
}

/* Takes `n` out of the counters and gives its charge back; pt_mu held
 * (the pool is atomics, a leaf; the bytes freed are counted after the
 * give, so that whoever sees them freed finds them in the pool). */
__attribute__((always_inline)) static inline void count_free(const node *n)
{
    shim_pt_counters *c = &counters[n->r.family][slot(n->r.ordinal)];
    c->frees++;
    c->bytes -= n->r.size;
    live_count_add(n->r.family, -1);
    nrecords--;
    if (n->r.charged) {
        shim_pool_give(n->r.charged, n->r.size);
        uint64_t v =
            atomic_load_explicit(&shim_pressure_watched_freed, memory_order_relaxed) + n->r.size;
        atomic_store_explicit(&shim_pressure_watched_freed, v, memory_order_relaxed);
    }
}

/* What the trace needs of a record unlinked under pt_mu, copied there
 * only while a trace is on (a node kept as a spare is reused at once). */
static bool traced(void)
{
    return atomic_load_explicit(&event_hook, memory_order_relaxed) != NULL;
}

bool shim_passthrough_remove(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return false;
    node *gone = NULL, *extra = NULL;
    shim_pt_record copy;
    uint64_t seq = 0;
    bool tell = traced();
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
    if (at) {
        gone = *at;
        *at = gone->next;
        count_free(gone);
        if (tell) {
            seq = shim_device_seq_next();
            copy = gone->r;
        }
        extra = keep_spare(gone);
    }
    pt_unlock();
    if (!gone)
        return false;
    node_free(extra);
    if (tell)
        record_gone(&copy, seq);
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

long shim_passthrough_unref(enum shim_pt_family f, uintptr_t ptr)
{
    if ((unsigned)f >= SHIM_PT_FAMILIES || !shim_passthrough_any(f))
        return -1;
    node *gone = NULL, *extra = NULL;
    shim_pt_record copy;
    uint64_t seq = 0;
    long left = -1;
    bool tell = traced();
    pt_lock();
    /* The newest record of ptr (records go in at the head): the program
     * holds that one; an older one is an object whose last release the
     * shim did not see (a leak, as far as it knows). */
    for (node **p = &table[bucket(ptr)]; *p; p = &(*p)->next) {
        node *x = *p;
        if (x->r.ptr != ptr || x->r.family != f)
            continue;
        left = (long)--x->r.refs;
        if (left == 0) {
            gone = x;
            *p = x->next;
            count_free(x);
            if (tell) {
                seq = shim_device_seq_next();
                copy = x->r;
            }
            extra = keep_spare(x);
        }
        break;
    }
    pt_unlock();
    if (gone) {
        if (__builtin_expect(extra != NULL, 0))
            node_free(extra);
        if (tell)
            record_gone(&copy, seq);
    }
    return left;
}

void shim_passthrough_mapped(enum shim_pt_family f, uintptr_t ptr, uintptr_t va, size_t size)
{
    /* VMM's only (keep_spare looks for a list of mappings there alone). */
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
                x->r.seq = shim_device_seq_next();
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

static void gone_list(node *list)
{
    while (list) {
        node *x = list;
        list = x->next;
        gone_record(x, x->r.seq);
    }
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
