/* A device's records and the state its files share: the shard (an arena
 * with its live table, lock, counters, blocks held for the device and its
 * prefetched frees), the device, the registry's list, the hooks, the
 * sequence counter, and the small helpers the allocation and free paths
 * inline (the shard of the calling thread, the sequence number, the live
 * bytes, the prefetched frees). Included by the device's files in
 * shim/alloc/ alone (docs/architecture.md names them); never by another
 * room. Helpers the hot paths call are `static` here, with the inlining
 * they had when all of this was one file, so that an allocation and a
 * free compile as before (docs/allocator.md, "Files").
 *
 * Locks (the table is docs/locking.md): a shard's lock guards that shard;
 * it is held across the runtime's own region reserve and release (so a
 * region cannot be handed out twice). A request takes its thread's
 * shard's lock and nothing else unless that shard cannot serve it; a free
 * takes the lock of the shard that served the block. The device lock
 * guards the pressure state and is taken for the slow path (no shard
 * could serve a request) and for walks of every shard, always before a
 * shard's lock. Neither is held across stack capture, logging of leak
 * reports, a wait for the device, or a foreign pointer's real free. No
 * file of the device ever dereferences a device address. */
#ifndef SHIM_DEVICE_INTERNAL_H
#define SHIM_DEVICE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"
#include "device.h"
#include "lock.h"
#include "mutex.h"
#include "pressure.h"
#include "seq.h"
#include "table.h"
#include "thread_live.h"

#pragma GCC visibility push(hidden)

/* A block freed by the program that the device may still be using: held
 * (out of the arena's reach) until a wait for the device covers it. Not to
 * be confused with the prefetched frees below, a matter of speed. */
typedef struct held_block {
    uint32_t node;
    uint64_t ticket;          /* order of the free; a wait covers tickets before it */
} held_block;

/* Frees whose arena work is finished later, once the node's line, whose
 * prefetch the free started, has arrived (free_after_prefetch): enough for
 * a node's line to arrive from memory over the pairs in between; one while
 * the shard has at most PREFETCH_DEEP_FROM_LIVE live blocks, whose nodes
 * (32 bytes each) stay in the cache, and where blocks freed just before
 * are what the next requests should get (measured: 8 cost 5% at 10,000
 * live blocks). A runtime with asynchronous work (CUDA) holds its frees
 * for the device instead (held_block). */
#define PREFETCHED_FREES 8
#define PREFETCH_DEEP_FROM_LIVE ((uint64_t)1 << 16)
_Static_assert((PREFETCHED_FREES & (PREFETCHED_FREES - 1)) == 0, "a power of two");

/* One arena of a device with its live table, its lock and its blocks
 * waiting for the device. A device starts with one shard; a thread that
 * finds its shard's lock held when it allocates moves to a shard of its own
 * while the device has fewer than SPYRESHIM_ARENAS, so that threads
 * allocating at the same time stop taking turns on one lock and one set of
 * cache lines. A block belongs to the shard that served it until freed. */
typedef struct shim_shard {
    spyreshim_lock lock;
    shim_arena *arena;
    shim_table *table;
    /* Guarded by lock. */
    uint64_t allocs, frees;
    uint64_t live_bytes, peak_live_bytes; /* bytes the program asked for */
    int64_t unpublished;      /* live bytes not yet in the device's live_total */
    held_block *held;         /* freed, the device may still use them; FIFO by ticket */
    size_t nheld, held_cap;
    uint64_t held_bytes, next_ticket;
    /* The blocks of the shard's last `nprefetched` frees
     * (free_after_prefetch), the last one before
     * prefetched[prefetched_pos]: out of the table, their nodes' lines
     * loading, and their arena frees and accounting left for
     * PREFETCHED_FREES frees later (or finish_prefetched_frees), when the
     * lines are there. Guarded by lock. */
    uint32_t prefetched[PREFETCHED_FREES];
    unsigned prefetched_pos, nprefetched;
    uint64_t freed_bytes;     /* requested bytes of every free; guarded by lock */
    /* Running threads that moved here (shard 0's own threads uncounted). */
    _Atomic unsigned homed;
    /* Advanced when the shard's context was torn down (its arena is a new
     * one): a node taken before a wait that dropped the lock is then
     * stale. Guarded by lock. */
    unsigned generation;
} shim_shard;

#define SHIM_MAX_SHARDS 8

struct shim_device {
    const shim_runtime *rt;   /* the route that created it: its backend */
    int ordinal;
    /* The context whose regions these are (0: a route without contexts).
     * Written under devices_mu; SHIM_CONTEXT_VACANT after its teardown,
     * until the next context of the ordinal takes the device. */
    _Atomic uintptr_t context;
    char name[32];
    /* Bytes the program may have here: the smaller of SPYRESHIM_LIMIT and
     * the runtime's total, asked once when the device is first served
     * (0 = not known yet, or the runtime does not say). */
    _Atomic uint64_t capacity;
    atomic_bool capacity_asked; /* shim_device_learn_capacity ran (once) */
    /* The device lock: pressure events (callbacks get it), the slow path of
     * an allocation no shard could serve, and every walk of the shards
     * (reports, statistics, trim, fork). Taken before a shard's lock;
     * never taken while holding one. */
    spyreshim_lock lock;
    shim_region_backend backend;
    shim_arena_pool pool;     /* the limit, shared by the shards' arenas */
    shim_pressure_state ps;   /* guarded by lock */
    unsigned index;               /* in devices[], for event hooks */
    unsigned max_shards;
    _Atomic unsigned nshards;     /* shards[0 .. nshards) are published */
    _Atomic unsigned next_move;   /* turns of threads moving once every shard is made */
    shim_shard *shards[SHIM_MAX_SHARDS];
    _Atomic bool fork_registered; /* announced ready: its fork handlers are installed */
    bool fork_locked;             /* its fork prepare handler holds every lock */
    unsigned fork_nshards;        /* the shards it locked */
    _Atomic uint64_t failed, invalid_frees, foreign_frees, device_waits;
    /* Live blocks (and their bytes) forgotten at their context's teardown;
     * blocks leave the shards' allocs when they are, so that a shard's
     * allocs - frees stays its live count. */
    _Atomic uint64_t teardown_blocks, teardown_bytes;
    /* True while the teardown destroys the context's arenas: their regions
     * are the runtime's to free, never released (backend_release). Guarded
     * by the device lock. */
    bool forgetting;
    /* Live bytes of all shards, each adding its changes in steps of
     * LIVE_STEP, and the highest such total: the device's peak once it has
     * several shards (one keeps its own, exact). Exact counts would need
     * an atomic add per allocation and free on a line every thread writes:
     * measured, it took two threads from 0.66 to 1.64 times one thread's
     * time per pair (docs/allocator.md). */
    _Atomic int64_t live_total;
    _Atomic uint64_t peak_total;
};

/* Past these (per arena: at least this many blocks, or more than this
 * fraction of its reserved bytes), a free waits for the device and reuses
 * what is held instead of letting it pile up (the real free waits on
 * every call). */
#define HELD_MAX_BLOCKS 4096
#define HELD_MAX_FRACTION 4   /* of the bytes reserved */
/* With several shards, the device's peak of live bytes is exact to
 * within this many bytes per shard. */
#define LIVE_STEP ((int64_t)1 << 20)

/* A device whose context is gone, free for the next one of its ordinal. */
#define SHIM_CONTEXT_VACANT UINTPTR_MAX

/* ---- shared state (defined in the file named) ----------------------- */

/* Live bytes of every device, in the same steps as each device's own
 * total, and the highest such sum: the process's peak is the peak of the
 * sum, not the sum of the devices' peaks. */
extern _Atomic int64_t live_all;   /* live.c */
extern _Atomic uint64_t peak_all;

/* device.c: the calling thread is inside a call of a real runtime function. */
extern __thread __attribute__((tls_model("initial-exec"))) unsigned tls_in_backend;
/* shard.c: the calling thread's shard of each device (an index; 0 until it
 * moves), and whether it already moved away from a busy shard. */
extern __thread __attribute__((tls_model("initial-exec"))) unsigned char tls_shard[SHIM_MAX_DEVICES];
extern __thread __attribute__((tls_model("initial-exec"))) unsigned char tls_moved[SHIM_MAX_DEVICES];

/* registry.c: leak hunting's hooks, set once at init by the layer above (the
 * allocator knows nothing of stacks or reports); NULL while leak hunting is
 * off. The trace's event hook: set once at init, NULL while tracing is
 * off. */
extern _Atomic(shim_capture_fn) capture_hook;
extern _Atomic(shim_oom_fn) oom_hook;
extern _Atomic(shim_event_fn) event_hook;

/* registry.c: the registry. devices_mu (a leaf but for the arena and table
 * creation) guards the creation of devices and which context a device
 * serves; devices[0 .. ndevices) are published with a release store. */
extern pthread_mutex_t devices_mu;
extern shim_device *devices[SHIM_MAX_DEVICES];
extern _Atomic size_t ndevices;

/* ---- the registry (registry.c's concept) --------------------------- */

__attribute__((unused)) static bool same_runtime(const shim_device *d, const shim_runtime *rt)
{
    return d->rt == rt || strcmp(d->rt->name, rt->name) == 0;
}

__attribute__((unused)) static shim_device *find_device(const shim_runtime *rt, int ordinal, uintptr_t context)
{
    size_t n = atomic_load_explicit(&ndevices, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (atomic_load_explicit(&devices[i]->context, memory_order_relaxed) == context &&
            devices[i]->ordinal == ordinal && same_runtime(devices[i], rt))
            return devices[i];
    return NULL;
}

/* The live device of `context` (nonzero), whatever its ordinal. */
static inline shim_device *find_context(const shim_runtime *rt, uintptr_t context)
{
    size_t n = atomic_load_explicit(&ndevices, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (atomic_load_explicit(&devices[i]->context, memory_order_relaxed) == context &&
            same_runtime(devices[i], rt))
            return devices[i];
    return NULL;
}

/* ---- shards (shard.c's concept) ------------------------------------- */

/* Takes a lock unless this thread holds it already: a pressure callback
 * that frees (or allocates) before releasing the lock must not deadlock on
 * itself. Returns whether it was taken here. */
__attribute__((unused)) static bool lock_unless_mine(spyreshim_lock *l)
{
    if (shim_lock_held_by_me(l))
        return false;
    shim_lock_acquire(l);
    return true;
}

/* The k-th shard from `home` of n, wrapping around (k < n): no division
 * on the free path. */
static inline unsigned shard_after(unsigned home, unsigned k, unsigned n)
{
    unsigned i = home + k;
    return i >= n ? i - n : i;
}

__attribute__((unused)) static unsigned shard_count(const shim_device *d)
{
    return atomic_load_explicit(&d->nshards, memory_order_acquire);
}

/* The calling thread's shard of `d`. */
__attribute__((unused)) static unsigned home_index(const shim_device *d)
{
    unsigned i = tls_shard[d->index];
    return i < shard_count(d) ? i : 0;
}

/* ---- live bytes and the prefetched frees (the paths' accounting) ---- */

/* Live bytes of `s` changed by `delta`: exact in the shard; the device's
 * total and peak follow in steps. Shard lock held. */
static void publish_live(shim_device *d, shim_shard *s);

static inline void note_live(shim_device *d, shim_shard *s, int64_t delta)
{
    if (delta > 0) {
        s->live_bytes += (uint64_t)delta;
        if (s->live_bytes > s->peak_live_bytes)
            s->peak_live_bytes = s->live_bytes;
    } else {
        s->live_bytes -= (uint64_t)-delta;
    }
    s->unpublished += delta;
    if (s->unpublished < LIVE_STEP && s->unpublished > -LIVE_STEP)
        return;
    publish_live(d, s);
}

/* Out of line (a step in a few calls): the shard's unpublished live bytes
 * into the device's total and peak. With one thread no other can update
 * them in between, and lock-prefixed operations would be full barriers. */
__attribute__((unused)) static void add_and_raise(_Atomic int64_t *total, _Atomic uint64_t *peak, int64_t delta)
{
    if (shim_single_threaded()) {
        int64_t now = atomic_load_explicit(total, memory_order_relaxed) + delta;
        atomic_store_explicit(total, now, memory_order_relaxed);
        if (now > 0 && (uint64_t)now > atomic_load_explicit(peak, memory_order_relaxed))
            atomic_store_explicit(peak, (uint64_t)now, memory_order_relaxed);
        return;
    }
    int64_t now = atomic_fetch_add_explicit(total, delta, memory_order_relaxed) + delta;
    uint64_t p = atomic_load_explicit(peak, memory_order_relaxed);
    while (now > 0 && (uint64_t)now > p &&
           !atomic_compare_exchange_weak_explicit(peak, &p, (uint64_t)now, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

/* The device's total and the process's (every device), each with its
 * peak. */
__attribute__((noinline, unused)) static void publish_live(shim_device *d, shim_shard *s)
{
    int64_t delta = s->unpublished;
    s->unpublished = 0;
    add_and_raise(&d->live_total, &d->peak_total, delta);
    add_and_raise(&live_all, &peak_all, delta);
}

/* A free of `size` requested bytes, in the shard's counters. Shard lock
 * held. */
static inline void count_free(shim_device *d, shim_shard *s, size_t size)
{
    s->frees++;
    note_live(d, s, -(int64_t)size);
    s->freed_bytes += size;
}

/* A deferred free of live block `node` (free_after_prefetch), finished: the
 * arena's free (which reads the node) and the accounting. Shard lock
 * held. */
static inline void finish_free(shim_device *d, shim_shard *s, uint32_t node)
{
    size_t size;
    shim_arena_free_live(s->arena, node, &size);
    count_free(d, s, size);
}

/* Frees live block `node` (out of the table already) without reading its
 * node: the table confirmed the block from its slot, so the node's line
 * starts loading now, and the free that reads it waits for the shard's
 * next use: usually the next free (PREFETCHED_FREES frees later in a large
 * shard), which finishes this one, its line having had that long. No
 * trace to tell (it would want the size now), no device to wait for.
 * Shard lock held. */
static inline void free_after_prefetch(shim_device *d, shim_shard *s, uint32_t node)
{
    unsigned k = s->prefetched_pos, n = s->nprefetched;
    shim_arena_prefetch(s->arena, node);
    if (s->allocs - s->frees > PREFETCH_DEEP_FROM_LIVE) {
        shim_table_prefetch_fields(s->table, node);
        if (n == PREFETCHED_FREES)
            finish_free(d, s, s->prefetched[k]); /* the oldest */
        else
            n++;
    } else if (n) {
        /* One deep (after more, when the shard shrank): the oldest go. */
        do
            finish_free(d, s, s->prefetched[(k - n) & (PREFETCHED_FREES - 1)]);
        while (--n);
        n = 1;
    } else {
        n = 1;
    }
    s->nprefetched = n;
    s->prefetched[k] = node;
    s->prefetched_pos = (k + 1) & (PREFETCHED_FREES - 1);
}

/* Finishes the frees free_after_prefetch left, oldest first: before anything that
 * looks at the shard's counters or the arena's blocks. Shard lock held. */
static inline void finish_prefetched_frees(shim_device *d, shim_shard *s)
{
    unsigned n = s->nprefetched;
    s->nprefetched = 0;
    for (unsigned k = s->prefetched_pos - n; k != s->prefetched_pos; k++)
        finish_free(d, s, s->prefetched[k & (PREFETCHED_FREES - 1)]);
}

/* A shard's lock unless this thread holds it already (lock_unless_mine),
 * with the shard settled. Returns whether it was taken here. */
__attribute__((unused)) static bool lock_with_frees_finished(shim_device *d, shim_shard *s)
{
    bool taken = lock_unless_mine(&s->lock);
    finish_prefetched_frees(d, s);
    return taken;
}

/* ---- functions of one device file called by another ------------------ */

/* shard.c */
unsigned shim_shard_default_count(void);
shim_shard *shim_shard_create(shim_device *d);
shim_shard *shim_shard_lock_home(shim_device *d, bool *taken);

/* context.c: device d's context is gone; forgets everything it holds. */
void shim_context_forget(shim_device *d);
/* context.c: whether `addr` is a dead address of a region forgotten at
 * its context's teardown: in the ring, and not live memory the runtime
 * gave out again (rt->holds). No allocator lock held. */
bool shim_forgotten_dead(const shim_runtime *rt, uintptr_t addr);

/* held.c: the device's free semantics (a block is reused only once a wait
 * for the device covered its free). */
bool hold_for_device(shim_shard *s, uint32_t node, size_t block);
bool too_much_held(const shim_shard *s);
bool wait_and_reuse_held(shim_device *d, shim_shard *s);
bool wait_and_relock(shim_device *d, shim_shard *s);
bool wait_and_reuse_all_held(shim_device *d);

/* room.c: what a request has spent on getting memory back, and the step
 * that makes room after a failed try on every shard. */
/* What a request has spent on getting memory back. Rounds count the
 * events it ran; waits for another thread's event count apart, with a
 * larger bound: under heavy concurrency a thread can lose what each event
 * freed to others a few times in a row without anything being wrong. */
struct relief_budget {
    unsigned rounds, waits, max_rounds;
    bool trimmed;
};
bool shim_device_make_room(shim_device *d, size_t size, struct relief_budget *b);

/* device_fork.c: the device's first call returned: its fork handlers can
 * be installed. */
void shim_device_announce_ready(shim_device *d);

#pragma GCC visibility pop

#endif
