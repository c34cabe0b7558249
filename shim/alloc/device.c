/* One device of an intercepted runtime: its arenas (shards: an arena, its
 * live table, its lock, its blocks freed but still in use by the device),
 * its pressure state and its device lock. Every entry point of hooks/ lands
 * here. Where a runtime has contexts (CUDA), a shim_device is one context
 * of a device: its regions are that context's, the runtime frees them when
 * the context goes, and the shim then forgets them (forget_context).
 *
 * Locks: an arena's lock guards that shard; it is held across the
 * runtime's own region reserve and release (so a region cannot be handed
 * out twice). A request takes its thread's shard's lock and nothing else
 * unless that shard cannot serve it; a free takes the lock of the shard
 * that served the block. The device lock guards the pressure state and is
 * taken for the slow path (no shard could serve a request) and for walks
 * of every shard, always before a shard's lock. Neither is held across
 * stack capture, logging of leak reports, a wait for the device, or a
 * foreign pointer's real free. The lock table is docs/locking.md.
 * Never dereferences a device address. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"
#include "device.h"
#include "hostmem.h"
#include "lock.h"
#include "log.h"
#include "mutex.h"
#include "options.h"
#include "pressure.h"

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

/* Live bytes of every device, in the same steps as each device's own
 * total, and the highest such sum: the process's peak is the peak of the
 * sum, not the sum of the devices' peaks. */
static _Atomic int64_t live_all;
static _Atomic uint64_t peak_all;

/* Regions forgotten at their context's teardown (the runtime freed them):
 * a later free of an address inside one is answered as the runtime
 * answers a dead pointer, never passed to it as if live (it may have given
 * the address to someone else). The last FORGOTTEN_MAX, dropped when the
 * shim reserves a region over one. Guarded by forgotten_mu, a leaf. */
#define FORGOTTEN_MAX 256
static pthread_mutex_t forgotten_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t start, end;
} forgotten[FORGOTTEN_MAX];
static size_t forgotten_next;
static _Atomic bool any_forgotten;

static __thread __attribute__((tls_model("initial-exec"))) unsigned tls_in_backend;
/* The calling thread's shard of each device (an index; 0 until it moves). */
static __thread __attribute__((tls_model("initial-exec"))) unsigned char tls_shard[SHIM_MAX_DEVICES];
/* Whether the calling thread already moved away from a busy shard. */
static __thread __attribute__((tls_model("initial-exec"))) unsigned char tls_moved[SHIM_MAX_DEVICES];

/* Leak hunting's hooks, set once at init by the layer above (the allocator
 * knows nothing of stacks or reports); NULL while leak hunting is off. */
static _Atomic(shim_capture_fn) capture_hook;
static _Atomic(shim_oom_fn) oom_hook;
static _Atomic(shim_device_ready_fn) ready_hook;
/* The trace's event hook: set once at init, NULL while tracing is off. */
static _Atomic(shim_event_fn) event_hook;

static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
/* The hook resolution lock (device.h): taken before devices_mu. */
static pthread_mutex_t publish_mu = PTHREAD_MUTEX_INITIALIZER;
static shim_device *devices[SHIM_MAX_DEVICES];
static _Atomic size_t ndevices;
/* Allocation sequence numbers. With one thread, every allocation adds one
 * to the counter. With several, a thread takes SEQ_BATCH numbers at a
 * time and hands them out itself: one shared counter added to by every
 * allocation of two threads took half of an allocation's time (its line
 * going from core to core). A mark (shim_device_seq_now) reads the counter
 * and then advances the epoch, which ends every thread's batch: whatever a
 * thread allocates after the mark (happens-after it) takes a new batch,
 * above the mark. While a trace is taken, numbers come from the counter
 * one by one: the trace orders events by them. Counter and epoch each on
 * a line of its own (the epoch is read by every allocation and written by
 * marks only). */
#define SEQ_BATCH 64
static _Alignas(64) _Atomic uint64_t seq_counter;
static _Alignas(64) _Atomic uint64_t seq_epoch;
static _Alignas(64) char seq_epoch_end_[1] __attribute__((unused));
static __thread __attribute__((tls_model("initial-exec"))) struct {
    uint64_t next, end, epoch;
} tls_seq;

bool shim_device_in_backend(void)
{
    return tls_in_backend != 0;
}

/* A region reserved or released, for a trace (regions are rare: no cost
 * that matters on the allocation path). */
static void region_event(shim_device *d, enum shim_event_kind k, uintptr_t addr, size_t size)
{
    shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(k, d->index, shim_device_seq_next(), addr, size, 0, 0);
}

static int backend_reserve(void *ctx, size_t size, uintptr_t *addr)
{
    shim_device *d = ctx;
    void *p = NULL;
    tls_in_backend++;
    int rc = d->rt->real_malloc(&p, size);
    tls_in_backend--;
    if (rc == 0 && !p)
        rc = d->rt->err_oom;
    if (rc == d->rt->err_oom)
        return 1;   /* no room: the arena may try a smaller region */
    if (rc != 0)
        return -rc; /* another failure (no driver, a stub library): final */
    *addr = (uintptr_t)p;
    shim_debug("%s: reserved region %p + %zu", d->name, p, size);
    region_event(d, SHIM_EVENT_SEGMENT_ALLOC, *addr, size);
    if (atomic_load_explicit(&any_forgotten, memory_order_relaxed)) {
        /* The runtime gave a forgotten address back out: it is live again. */
        shim_mutex_lock(&forgotten_mu);
        for (size_t i = 0; i < FORGOTTEN_MAX; i++)
            if (forgotten[i].start < *addr + size && *addr < forgotten[i].end)
                forgotten[i].start = forgotten[i].end = 0;
        shim_mutex_unlock(&forgotten_mu);
    }
    return 0;
}

static void forget_region(uintptr_t addr, size_t size)
{
    shim_mutex_lock(&forgotten_mu);
    forgotten[forgotten_next].start = addr;
    forgotten[forgotten_next].end = addr + size;
    forgotten_next = (forgotten_next + 1) % FORGOTTEN_MAX;
    atomic_store_explicit(&any_forgotten, true, memory_order_relaxed);
    shim_mutex_unlock(&forgotten_mu);
}

static bool in_forgotten_region(uintptr_t addr)
{
    if (!atomic_load_explicit(&any_forgotten, memory_order_relaxed))
        return false;
    bool in = false;
    shim_mutex_lock(&forgotten_mu);
    for (size_t i = 0; i < FORGOTTEN_MAX && !in; i++)
        in = addr >= forgotten[i].start && addr < forgotten[i].end;
    shim_mutex_unlock(&forgotten_mu);
    return in;
}

static void backend_release(void *ctx, uintptr_t addr, size_t size)
{
    shim_device *d = ctx;
    region_event(d, SHIM_EVENT_SEGMENT_FREE, addr, size);
    if (d->forgetting) {
        /* Its context's teardown: the runtime frees the region itself. */
        forget_region(addr, size);
        shim_debug("%s: forgot region %#lx + %zu (its context is torn down)", d->name,
                   (unsigned long)addr, size);
        return;
    }
    tls_in_backend++;
    int rc = d->rt->real_free((void *)addr);
    tls_in_backend--;
    if (rc != 0)
        shim_warn("%s: the runtime refused to free region %#lx + %zu (error %d)",
                  d->name, (unsigned long)addr, size, rc);
    else
        shim_debug("%s: released region %#lx + %zu", d->name, (unsigned long)addr, size);
}

static int backend_mem_info(void *ctx, size_t *free, size_t *total)
{
    shim_device *d = ctx;
    tls_in_backend++;
    int rc = d->rt->real_mem_info(free, total);
    tls_in_backend--;
    return rc;
}


static unsigned default_shards(void)
{
    unsigned n = shim_opts()->arenas;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
    }
    return n > SHIM_MAX_SHARDS ? SHIM_MAX_SHARDS : n;
}

static shim_shard *shard_create(shim_device *d)
{
    shim_shard *s = shim_hostmem_lines(sizeof *s);
    if (!s)
        return NULL;
    shim_lock_init_fast(&s->lock);
    const shim_options *o = shim_opts();
    s->arena = shim_arena_create(&d->backend, o->limit, o->region_size);
    s->table = s->arena ? shim_table_create(1024, (unsigned)__builtin_ctzll(d->backend.alignment))
                        : NULL;
    if (!s->arena || !s->table) {
        if (s->arena)
            shim_arena_destroy(s->arena);
        if (s->table)
            shim_table_destroy(s->table);
        free(s);
        return NULL;
    }
    shim_arena_set_pool(s->arena, &d->pool);
    return s;
}

static uint64_t freed_everywhere(void);

static bool same_runtime(const shim_device *d, const shim_runtime *rt);

/* `others`: devices of the same runtime and ordinal made before (other
 * contexts of that device live at the same time): "cuda:0.1", ... */
static shim_device *device_create(const shim_runtime *rt, int ordinal, uintptr_t context,
                                  unsigned others)
{
    shim_device *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->rt = rt;
    d->ordinal = ordinal;
    atomic_init(&d->context, context);
    if (rt->current_device && others)
        snprintf(d->name, sizeof d->name, "%s:%d.%u", rt->name, ordinal, others);
    else if (rt->current_device)
        snprintf(d->name, sizeof d->name, "%s:%d", rt->name, ordinal);
    else
        snprintf(d->name, sizeof d->name, "%s", rt->name);
    shim_lock_init(&d->lock);
    shim_pressure_state_init(&d->ps);
    d->backend = (shim_region_backend){
        .ctx = d,
        .reserve = backend_reserve,
        .release = backend_release,
        .mem_info = backend_mem_info,
        .alignment = rt->alignment,
    };
    d->max_shards = default_shards();
    d->shards[0] = shard_create(d);
    if (!d->shards[0]) {
        free(d);
        return NULL;
    }
    atomic_store_explicit(&d->nshards, 1, memory_order_release);
    shim_pressure_set_freed_source(freed_everywhere);
    return d;
}

void shim_device_set_leak_hooks(shim_capture_fn capture, shim_oom_fn on_oom)
{
    atomic_store(&oom_hook, on_oom);
    atomic_store(&capture_hook, capture);
}

void shim_device_set_event_hook(shim_event_fn fn)
{
    atomic_store(&event_hook, fn);
}

/* A new batch of sequence numbers for the calling thread; returns its
 * first. */
__attribute__((noinline)) static uint64_t seq_refill(uint64_t epoch)
{
    uint64_t base = atomic_fetch_add_explicit(&seq_counter, SEQ_BATCH, memory_order_relaxed);
    tls_seq.epoch = epoch;
    tls_seq.next = base + 2;
    tls_seq.end = base + SEQ_BATCH + 1;
    return base + 1;
}

/* Inline: every allocation takes one. */
static inline uint64_t seq_take(void)
{
    /* One thread: no other can take a number between the load and the
     * store, and a lock-prefixed add would be a full barrier per call. */
    if (shim_single_threaded()) {
        uint64_t v = atomic_load_explicit(&seq_counter, memory_order_relaxed) + 1;
        atomic_store_explicit(&seq_counter, v, memory_order_relaxed);
        return v;
    }
    if (atomic_load_explicit(&event_hook, memory_order_relaxed)) {
        tls_seq.end = 0; /* a batch from before would go back in time */
        return atomic_fetch_add_explicit(&seq_counter, 1, memory_order_relaxed) + 1;
    }
    /* Acquire: a batch taken after a mark's epoch is taken after the
     * mark's read of the counter, so its numbers are above the mark. */
    uint64_t e = atomic_load_explicit(&seq_epoch, memory_order_acquire);
    if (tls_seq.next < tls_seq.end && tls_seq.epoch == e)
        return tls_seq.next++;
    return seq_refill(e);
}

uint64_t shim_device_seq_next(void)
{
    return seq_take();
}

static bool same_runtime(const shim_device *d, const shim_runtime *rt)
{
    return d->rt == rt || strcmp(d->rt->name, rt->name) == 0;
}

static shim_device *find_device(const shim_runtime *rt, int ordinal, uintptr_t context)
{
    size_t n = atomic_load_explicit(&ndevices, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (atomic_load_explicit(&devices[i]->context, memory_order_relaxed) == context &&
            devices[i]->ordinal == ordinal && same_runtime(devices[i], rt))
            return devices[i];
    return NULL;
}

shim_device *shim_device_get_ordinal(const shim_runtime *rt, int ordinal)
{
    return shim_device_get_context(rt, ordinal, 0);
}

shim_device *shim_device_get_context(const shim_runtime *rt, int ordinal, uintptr_t context)
{
    shim_device *d = find_device(rt, ordinal, context);
    if (d)
        return d;
    shim_mutex_lock(&devices_mu);
    d = find_device(rt, ordinal, context);
    /* A device whose context was torn down serves the next context of its
     * ordinal: the same name in statistics and reports, and the number of
     * devices stays bounded however many contexts come and go. */
    if (!d && context)
        d = find_device(rt, ordinal, SHIM_CONTEXT_VACANT);
    if (d && atomic_load_explicit(&d->context, memory_order_relaxed) == SHIM_CONTEXT_VACANT) {
        atomic_store_explicit(&d->context, context, memory_order_release);
        shim_debug("%s: serving a new context", d->name);
    }
    size_t n = atomic_load_explicit(&ndevices, memory_order_relaxed);
    if (!d && n < SHIM_MAX_DEVICES) {
        unsigned others = 0;
        for (size_t i = 0; i < n; i++)
            others += devices[i]->ordinal == ordinal && same_runtime(devices[i], rt);
        d = device_create(rt, ordinal, context, others);
        if (d) {
            d->index = (unsigned)n;
            devices[n] = d;
            atomic_store_explicit(&ndevices, n + 1, memory_order_release);
            shim_debug("%s: serving allocations (limit %zu bytes, up to %u arenas)", d->name,
                       shim_opts()->limit, d->max_shards);
        }
    }
    shim_mutex_unlock(&devices_mu);
    return d;
}

shim_device *shim_device_get(const shim_runtime *rt)
{
    return shim_device_get_ordinal(rt, 0);
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

int shim_device_for_caller(const shim_runtime *rt, shim_device **out)
{
    int ordinal = 0;
    uintptr_t context = 0;
    if (rt->current_context) {
        int rc = rt->current_context(&context);
        if (rc != 0)
            return rc;
        if (context && (*out = find_context(rt, context)) != NULL)
            return 0;
    }
    if (rt->current_device) {
        int rc = rt->current_device(&ordinal, &context);
        if (rc != 0)
            return rc;
    }
    *out = shim_device_get_context(rt, ordinal, context);
    return *out ? 0 : rt->err_oom;
}

int shim_device_malloc_current(const shim_runtime *rt, void **ptr, size_t size)
{
    shim_device *d;
    int rc = shim_device_for_caller(rt, &d);
    return rc ? rc : shim_device_malloc(d, ptr, size);
}

int shim_device_mem_info_current(const shim_runtime *rt, size_t *free_out, size_t *total_out)
{
    shim_device *d;
    int rc = shim_device_for_caller(rt, &d);
    return rc ? rc : shim_device_mem_info(d, free_out, total_out);
}

const char *shim_device_name(const shim_device *d)
{
    return d->name;
}

size_t shim_device_count(void)
{
    return atomic_load_explicit(&ndevices, memory_order_acquire);
}

shim_device *shim_device_at(size_t i)
{
    return i < shim_device_count() ? devices[i] : NULL;
}

uint64_t shim_device_seq_now(void)
{
    /* The counter first, then the epoch: a batch taken before the read is
     * at or below it, and no thread uses a batch from before the epoch
     * advanced once the mark is taken (seq_take). */
    uint64_t now = atomic_load_explicit(&seq_counter, memory_order_seq_cst);
    atomic_fetch_add_explicit(&seq_epoch, 1, memory_order_seq_cst);
    return now;
}

/* Takes a lock unless this thread holds it already: a pressure callback
 * that frees (or allocates) before releasing the lock must not deadlock on
 * itself. Returns whether it was taken here. */
static bool lock_unless_mine(spyreshim_lock *l)
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

static unsigned shard_count(const shim_device *d)
{
    return atomic_load_explicit(&d->nshards, memory_order_acquire);
}

/* The calling thread's shard of `d`. */
static unsigned home_index(const shim_device *d)
{
    unsigned i = tls_shard[d->index];
    return i < shard_count(d) ? i : 0;
}

/* Threads that moved are counted on their shard while they run: the key's
 * destructor uncounts them when they exit. */
static pthread_key_t moved_key;
static pthread_once_t moved_once = PTHREAD_ONCE_INIT;

static void thread_gone(void *unused)
{
    (void)unused;
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++)
        if (tls_moved[i]) {
            tls_moved[i] = 0;
            atomic_fetch_sub_explicit(&devices[i]->shards[tls_shard[i]]->homed, 1,
                                      memory_order_relaxed);
        }
}

static void make_moved_key(void)
{
    if (pthread_key_create(&moved_key, thread_gone) != 0)
        moved_key = (pthread_key_t)-1;
}

/* Makes shard k (> 0) the calling thread's, for good. */
static shim_shard *home_on(shim_device *d, unsigned k)
{
    pthread_once(&moved_once, make_moved_key);
    if (moved_key != (pthread_key_t)-1)
        pthread_setspecific(moved_key, (void *)1);
    tls_moved[d->index] = 1;
    tls_shard[d->index] = (unsigned char)k;
    atomic_fetch_add_explicit(&d->shards[k]->homed, 1, memory_order_relaxed);
    return d->shards[k];
}

/* A shard (not `from`) that no running thread moved to, made its home,
 * or NULL. */
static shim_shard *home_on_unused(shim_device *d, unsigned from)
{
    unsigned n = shard_count(d);
    for (unsigned k = 1; k < n; k++)
        if (k != from && atomic_load_explicit(&d->shards[k]->homed, memory_order_relaxed) == 0)
            return home_on(d, k);
    return NULL;
}

/* The calling thread found its shard's lock held by another thread:
 * gives it a shard of its own while the device has room for one (made
 * here), else one that no running thread moved to, else leaves it where
 * it is. Returns the shard to lock. */
static shim_shard *move_thread(shim_device *d, unsigned from)
{
    /* A trace orders events by sequence number, taken in the critical
     * section: with one lock that is the order in which live bytes
     * changed, and the trace's peak is the statistics' one. */
    if (atomic_load_explicit(&event_hook, memory_order_relaxed))
        return d->shards[from];
    /* A thread moves once: moving again at every contention makes two
     * threads chase each other, their blocks spread over both shards and
     * every free contends (measured: 2.5-3x one thread's time per pair). */
    if (tls_moved[d->index])
        return d->shards[from];
    unsigned made = 0;
    if (shard_count(d) < d->max_shards) {
        /* Made under the device lock: fork's prepare holds it from before
         * it counts the shards it locks until they are released, so no
         * shard appears (unlocked, perhaps in use) in that window. */
        bool taken = lock_unless_mine(&d->lock);
        unsigned n = shard_count(d);
        if (n < d->max_shards) {
            shim_shard *s = shard_create(d);
            if (s) {
                d->shards[n] = s;
                atomic_store_explicit(&d->nshards, n + 1, memory_order_release);
                shim_debug("%s: arena %u for a thread that found arena %u busy", d->name, n,
                           from);
                made = n;
            }
        }
        if (taken)
            shim_lock_release(&d->lock);
    }
    if (made)
        return home_on(d, made);
    /* Every shard made: new threads start on shard 0, and two that meet
     * there after the last shard was made would otherwise share it for
     * good. */
    shim_shard *s = home_on_unused(d, from);
    return s ? s : d->shards[from];
}

/* Locks the calling thread's shard; *taken as lock_unless_mine. */
static shim_shard *lock_home(shim_device *d, bool *taken)
{
    unsigned i = home_index(d);
    shim_shard *s = d->shards[i];
    if (shim_lock_held_by_me(&s->lock)) {
        *taken = false;
        return s;
    }
    *taken = true;
    if (shim_lock_try(&s->lock))
        return s;
    s = move_thread(d, i);
    shim_lock_acquire(&s->lock);
    return s;
}

static void announce_ready(shim_device *d);

static void forget_context(shim_device *d);

/* Lets the device catch up with every free made before the call: a block
 * of one context may be used by work queued in any context of its device,
 * so every live context of d's device that the shim knows (it served it)
 * is waited for; none is made for the wait. A context found gone is torn
 * down (its blocks, d's own among them when it is d's, are forgotten).
 * Called without any allocator lock held by this thread (the wait blocks).
 * True when every wait succeeded; on another failure warns once and
 * returns false: the blocks stay held (the device may still write
 * them). */
__attribute__((noinline)) static bool wait_for_device(shim_device *d)
{
    shim_device *ctxs[SHIM_MAX_DEVICES];
    size_t m = 0, n = shim_device_count();
    uintptr_t mine = atomic_load_explicit(&d->context, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        shim_device *e = devices[i];
        uintptr_t c = atomic_load_explicit(&e->context, memory_order_acquire);
        if (e == d || (mine && c && c != SHIM_CONTEXT_VACANT && e->ordinal == d->ordinal &&
                       same_runtime(e, d->rt)))
            ctxs[m++] = e;
    }
    bool ok = true;
    for (size_t i = 0; i < m; i++) {
        uintptr_t c = atomic_load_explicit(&ctxs[i]->context, memory_order_acquire);
        if (c == SHIM_CONTEXT_VACANT)
            continue;
        tls_in_backend++;
        int rc = ctxs[i]->rt->sync_device(ctxs[i]->ordinal, c);
        tls_in_backend--;
        if (rc == SHIM_SYNC_GONE) {
            /* Torn down by a route the shim does not see: the runtime
             * freed its memory, the wait has nothing left to cover. */
            forget_context(ctxs[i]);
            continue;
        }
        if (rc != 0) {
            ok = false;
            static _Atomic bool warned;
            if (!atomic_exchange(&warned, true))
                shim_warn("%s: waiting for the device failed (error %d); the blocks freed "
                          "since the last wait stay unused", ctxs[i]->name, rc);
        }
    }
    atomic_fetch_add_explicit(&d->device_waits, 1, memory_order_relaxed);
    return ok;
}

/* Gives back to the arena the held blocks of `s` freed before `covered`.
 * Shard lock held. False when there were none. */
static bool reuse_covered(shim_shard *s, uint64_t covered)
{
    shim_lock_assert_held(&s->lock);
    size_t k = 0;
    while (k < s->nheld && s->held[k].ticket < covered) {
        s->held_bytes -= shim_arena_free_node(s->arena, s->held[k].node);
        k++;
    }
    memmove(s->held, s->held + k, (s->nheld - k) * sizeof *s->held);
    s->nheld -= k;
    return k > 0;
}

/* Waits for the device, then gives back to the arena every block of `s`
 * freed before the wait began. Shard lock held on entry and exit (taken by
 * the caller, and no other allocator lock), released while waiting. */
__attribute__((noinline)) static bool wait_and_reuse_held(shim_device *d, shim_shard *s)
{
    shim_lock_assert_held(&s->lock);
    uint64_t covered = s->next_ticket;
    /* The wait blocks: never with an allocator lock (docs/locking.md). */
    shim_lock_release(&s->lock);
    bool ok = wait_for_device(d);
    shim_lock_acquire(&s->lock);
    return ok && reuse_covered(s, covered);
}

/* Waits for the device with the shard's lock dropped. Shard lock held on
 * entry and exit. */
__attribute__((noinline)) static bool wait_and_relock(shim_device *d, shim_shard *s)
{
    shim_lock_release(&s->lock);
    bool ok = wait_for_device(d);
    shim_lock_acquire(&s->lock);
    return ok;
}

/* Keeps a freed block aside until the device has run what was queued
 * before the free. Shard lock held. False when out of host memory for the
 * list (the caller then waits for the device right away). */
static bool hold_for_device(shim_shard *s, uint32_t node, size_t block)
{
    shim_lock_assert_held(&s->lock);
    if (s->nheld == s->held_cap) {
        size_t cap = s->held_cap ? s->held_cap * 2 : 64;
        held_block *p = realloc(s->held, cap * sizeof *p);
        if (!p)
            return false;
        s->held = p;
        s->held_cap = cap;
    }
    s->held[s->nheld++] = (held_block){.node = node, .ticket = s->next_ticket++};
    s->held_bytes += block;
    return true;
}

static bool too_much_held(const shim_shard *s)
{
    shim_lock_assert_held(&s->lock);
    if (s->nheld >= HELD_MAX_BLOCKS)
        return true;
    shim_arena_counters c;
    shim_arena_get_counters(s->arena, &c);
    return s->held_bytes > c.reserved_bytes / HELD_MAX_FRACTION;
}

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
static void add_and_raise(_Atomic int64_t *total, _Atomic uint64_t *peak, int64_t delta)
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
__attribute__((noinline)) static void publish_live(shim_device *d, shim_shard *s)
{
    int64_t delta = s->unpublished;
    s->unpublished = 0;
    add_and_raise(&d->live_total, &d->peak_total, delta);
    add_and_raise(&live_all, &peak_all, delta);
}

uint64_t shim_device_peak_all(void)
{
    return atomic_load_explicit(&peak_all, memory_order_relaxed);
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
static bool lock_with_frees_finished(shim_device *d, shim_shard *s)
{
    bool taken = lock_unless_mine(&s->lock);
    finish_prefetched_frees(d, s);
    return taken;
}

/* ---- context teardown ------------------------------------------------ */

struct forgotten_blocks {
    shim_record *v;           /* for the trace; NULL when not told */
    size_t n, cap;
    uint64_t count;
    const shim_arena *arena;
    uintptr_t *keys;          /* to empty the table */
    size_t nkeys;
};

static void note_forgotten(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user)
{
    struct forgotten_blocks *fb = user;
    fb->count++;
    fb->keys[fb->nkeys++] = ptr;
    if (fb->v && fb->n < fb->cap)
        fb->v[fb->n++] = (shim_record){
            .ptr = ptr,
            .size = shim_arena_block_requested(fb->arena, id),
            .seq = f->seq,
            .native_stack = shim_arena_tag(fb->arena, id, 0),
            .python_stack = shim_arena_tag(fb->arena, id, 1),
        };
}

/* Forgets shard `s` (its context is gone): blocks, held blocks, regions.
 * Device lock and shard lock held. */
static void forget_shard(shim_device *d, shim_shard *s, struct forgotten_blocks *fb)
{
    const shim_options *o = shim_opts();
    finish_prefetched_frees(d, s);
    shim_arena *fresh = shim_arena_create(&d->backend, o->limit, o->region_size);
    size_t count = shim_table_count(s->table);
    uintptr_t *keys = count ? malloc(count * sizeof *keys) : NULL;
    if (!fresh || (count && !keys)) {
        /* Out of host memory: the regions stay, and are never handed out
         * again only if the runtime's reserve refuses them; say so. */
        shim_warn("%s: out of host memory while forgetting a torn-down context", d->name);
        if (fresh)
            shim_arena_destroy(fresh);
        free(keys);
        return;
    }
    fb->arena = s->arena;
    fb->keys = keys;
    fb->nkeys = 0;
    uint64_t before = fb->count;
    shim_table_foreach(s->table, note_forgotten, fb);
    for (size_t i = 0; i < fb->nkeys; i++)
        shim_table_remove(s->table, keys[i], NULL);
    free(keys);
    uint64_t blocks = fb->count - before;
    uint64_t bytes = s->live_bytes;
    atomic_fetch_add_explicit(&d->teardown_blocks, blocks, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->teardown_bytes, bytes, memory_order_relaxed);
    s->allocs -= blocks;
    if (bytes)
        note_live(d, s, -(int64_t)bytes);
    if (s->unpublished)
        publish_live(d, s);
    s->nheld = 0;
    s->held_bytes = 0;
    d->forgetting = true;
    shim_arena_destroy(s->arena);
    d->forgetting = false;
    s->arena = fresh;
    shim_arena_set_pool(fresh, &d->pool);
    s->generation++;
}

/* Device d's context is gone: forget everything it holds, release
 * nothing, wait for nothing; the device is then free for the next context
 * of its ordinal. Takes the device lock and every shard's (never held by
 * the caller, but a pressure callback's own are skipped). */
static void forget_context(shim_device *d)
{
    uintptr_t c = atomic_load_explicit(&d->context, memory_order_acquire);
    if (c == SHIM_CONTEXT_VACANT || c == 0)
        return;
    shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    struct forgotten_blocks fb = {0};
    bool dtaken = lock_unless_mine(&d->lock);
    unsigned n = shard_count(d);
    bool taken[SHIM_MAX_SHARDS];
    size_t live = 0;
    for (unsigned k = 0; k < n; k++) {
        taken[k] = lock_unless_mine(&d->shards[k]->lock);
        live += shim_table_count(d->shards[k]->table) + d->shards[k]->nprefetched;
    }
    if (ev && live) {
        fb.v = malloc(live * sizeof *fb.v);
        fb.cap = fb.v ? live : 0;
    }
    for (unsigned k = 0; k < n; k++)
        forget_shard(d, d->shards[k], &fb);
    /* Vacant only now: a request of the new context must not find the old
     * regions. */
    shim_mutex_lock(&devices_mu);
    atomic_store_explicit(&d->context, SHIM_CONTEXT_VACANT, memory_order_release);
    shim_mutex_unlock(&devices_mu);
    for (unsigned k = n; k-- > 0;)
        if (taken[k])
            shim_lock_release(&d->shards[k]->lock);
    if (dtaken)
        shim_lock_release(&d->lock);
    if (fb.count)
        shim_debug("%s: context torn down: %" PRIu64 " live blocks freed with it", d->name,
                   fb.count);
    /* The trace: each block freed now, by the teardown. */
    for (size_t i = 0; i < fb.n; i++)
        ev(SHIM_EVENT_FREE, d->index, shim_device_seq_next(), fb.v[i].ptr, fb.v[i].size,
           fb.v[i].native_stack, fb.v[i].python_stack);
    free(fb.v);
}

void shim_device_context_gone(const shim_runtime *rt, uintptr_t context)
{
    if (!context || context == SHIM_CONTEXT_VACANT)
        return;
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (same_runtime(d, rt) &&
            atomic_load_explicit(&d->context, memory_order_acquire) == context)
            forget_context(d);
    }
}

/* Step: one try at serving the request from shard `s`, recording the
 * block. Shard lock held. False when no block fits (or the table could not
 * grow: out of host memory, reported as out-of-memory too); *rt_err is
 * then the runtime's own error when it refused a region for a reason other
 * than out-of-memory (0 otherwise). *seq is the allocation's sequence
 * number. */
static inline __attribute__((always_inline)) bool
serve(shim_device *d, shim_shard *s, size_t size, bool may_grow, uint32_t nstack,
      uint32_t pystack, uintptr_t *out, uint64_t *seq, int *rt_err)
{
    shim_lock_assert_held(&s->lock);
    uintptr_t addr;
    uint32_t node;
    size_t block;
    int rc = shim_arena_alloc_fit(s->arena, size, &addr, &node, &block);
    if (rc != 0) {
        /* A block the last frees left for later may be what fits, and
         * must be, before a new region is reserved. */
        finish_prefetched_frees(d, s);
        rc = may_grow ? shim_arena_alloc(s->arena, size, &addr, &node, &block)
                      : shim_arena_alloc_fit(s->arena, size, &addr, &node, &block);
    }
    *rt_err = rc > 0 ? rc : 0;
    if (rc != 0)
        return false;
    shim_live_fields f = {
        .seq = seq_take(),
    };
    if (nstack | pystack) /* a new block's tags are 0 */
        shim_arena_set_tags(s->arena, node, nstack, pystack);
    if (shim_table_add(s->table, addr, node, &f) != 0) {
        shim_arena_free_node(s->arena, node);
        return false;
    }
    /* The blocks of the frees left for later still count as live.
     * Settling now would read their nodes, likely still on their way so
     * soon after the frees, so a later free does it; unless this
     * allocation may set a new peak or publish the shard's live bytes,
     * which must not count a block already freed. */
    if (s->nprefetched &&
        (s->live_bytes + size > s->peak_live_bytes || s->unpublished + (int64_t)size >= LIVE_STEP))
        finish_prefetched_frees(d, s);
    s->allocs++;
    note_live(d, s, (int64_t)size);
    *out = addr;
    *seq = f.seq;
    return true;
}

/* Step: serve from the shards, the caller's first (unless `skip_home`),
 * each under its own lock (the device lock may be held: it comes first in
 * the order). `steal`: from the free blocks of shards not busy now, the
 * caller's excepted, reserving nothing (room in a busy shard is not worth
 * a wait: the caller moved away from it for that); otherwise growing. */
static bool serve_any(shim_device *d, size_t size, bool steal, bool skip_home, uint32_t nstack,
                      uint32_t pystack, uintptr_t *out, uint64_t *seq, int *rt_err)
{
    unsigned n = shard_count(d), home = home_index(d);
    int first_err = 0;
    *rt_err = 0;
    for (unsigned k = steal || skip_home ? 1 : 0; k < n; k++) {
        shim_shard *s = d->shards[shard_after(home, k, n)];
        bool taken = !shim_lock_held_by_me(&s->lock);
        if (taken && steal && !shim_lock_try(&s->lock))
            continue;
        if (taken && !steal)
            shim_lock_acquire(&s->lock);
        bool ok = serve(d, s, size, !steal, nstack, pystack, out, seq, rt_err);
        if (taken)
            shim_lock_release(&s->lock);
        if (ok)
            return true;
        if (!first_err)
            first_err = *rt_err;
    }
    *rt_err = first_err;
    return false;
}

/* What a request has spent on getting memory back. Rounds count the
 * events it ran; waits for another thread's event count apart, with a
 * larger bound: under heavy concurrency a thread can lose what each event
 * freed to others a few times in a row without anything being wrong. */
struct relief_budget {
    unsigned rounds, waits, max_rounds;
    bool trimmed;
};

/* Waits for the device once and recycles every shard's held blocks
 * freed before the wait. Device lock held on entry and exit (released for
 * the wait). False when nothing was held. */
static bool wait_and_reuse_all_held(shim_device *d)
{
    shim_lock_assert_held(&d->lock);
    unsigned n = shard_count(d);
    uint64_t covered[SHIM_MAX_SHARDS];
    bool any = false;
    for (unsigned k = 0; k < n; k++) {
        shim_shard *s = d->shards[k];
        shim_lock_acquire(&s->lock);
        covered[k] = s->next_ticket;
        any |= s->nheld > 0;
        shim_lock_release(&s->lock);
    }
    if (!any)
        return false;
    shim_lock_release(&d->lock);
    bool ok = wait_for_device(d);
    shim_lock_acquire(&d->lock);
    if (!ok)
        return false; /* still held: the request goes on without them */
    bool recycled = false;
    for (unsigned k = 0; k < n; k++) {
        shim_shard *s = d->shards[k];
        shim_lock_acquire(&s->lock);
        recycled |= reuse_covered(s, covered[k]);
        shim_lock_release(&s->lock);
    }
    return recycled;
}

/* Gives every shard's empty regions back to the runtime; returns bytes. */
static size_t trim_all(shim_device *d)
{
    unsigned n = shard_count(d);
    size_t bytes = 0;
    for (unsigned k = 0; k < n; k++) {
        shim_shard *s = d->shards[k];
        bool taken = lock_with_frees_finished(d, s);
        bytes += shim_arena_trim(s->arena, 0);
        if (taken)
            shim_lock_release(&s->lock);
    }
    return bytes;
}

/* Step: after a failed try on every shard, makes room if anything still
 * can. Device lock held (a pressure event releases and re-acquires it).
 * False when the request must fail. */
static bool make_room(shim_device *d, size_t size, struct relief_budget *b)
{
    shim_lock_assert_held(&d->lock);
    /* Blocks freed while the device may still use them are the cheapest
     * memory there is: one wait for the device and they are free. */
    if (d->rt->sync_device && wait_and_reuse_all_held(d))
        return true;
    if (shim_pressure_in_event())
        return false; /* an allocation made by pressure work itself */
    /* Cached empty regions are free memory the runtime cannot see: give
     * them back first, so a larger region can be reserved. */
    if (!b->trimmed) {
        b->trimmed = true;
        if (trim_all(d) > 0)
            return true;
    }
    if (b->rounds >= b->max_rounds || b->waits >= 4 * b->max_rounds)
        return false;
    enum shim_relief r = shim_pressure_relieve(&d->ps, &d->lock, size);
    if (r == SHIM_RELIEF_NONE)
        return false;
    if (r == SHIM_RELIEF_RAN)
        b->rounds++;
    else
        b->waits++;
    b->trimmed = false;
    return true;
}

/* Step: the request failed for good. Called with the device lock held
 * when `taken`, returns without it. */
static int fail(shim_device *d, size_t size, bool taken)
{
    atomic_fetch_add_explicit(&d->failed, 1, memory_order_relaxed);
    shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    uint64_t seq = ev ? shim_device_seq_next() : 0;
    /* The verdict's facts (oomverdict.h): holes need every shard, under
     * the device lock taken before theirs. The failure path only. */
    shim_oom_facts facts = {.request = size, .holes_known = taken};
    for (unsigned k = 0, n = shard_count(d); k < n; k++) {
        shim_shard *s = d->shards[k];
        bool mine = lock_unless_mine(&s->lock);
        shim_arena_counters c;
        shim_arena_get_counters(s->arena, &c);
        facts.reserved += c.reserved_bytes;
        facts.used += c.used_bytes;
        facts.limit = k == 0 ? shim_arena_limit(s->arena) : facts.limit;
        uint64_t big = 0, in = 0;
        if (taken)
            shim_arena_holes(s->arena, &big, &in);
        facts.largest_hole = big > facts.largest_hole ? big : facts.largest_hole;
        facts.free_in_regions += in;
        if (mine)
            shim_lock_release(&s->lock);
    }
    size_t dfree = 0, dtotal = 0;
    facts.device_known = d->rt->real_mem_info && backend_mem_info(d, &dfree, &dtotal) == 0;
    facts.device_free = facts.device_known ? dfree : 0;
    facts.device_total = facts.device_known ? dtotal : 0;
    if (taken)
        shim_lock_release(&d->lock);
    shim_debug("%s: out of memory for %zu bytes", d->rt->name, size);
    shim_oom_fn on_oom = atomic_load_explicit(&oom_hook, memory_order_relaxed);
    if (ev) {
        /* The failure path only: what the runtime says is free, and the
         * failing request's stacks, for the trace's readers. */
        uint32_t ns = 0, ps = 0;
        shim_capture_fn capture = atomic_load_explicit(&capture_hook, memory_order_relaxed);
        if (capture)
            capture(&ns, &ps);
        ev(SHIM_EVENT_OOM, d->index, seq, facts.device_free, size, ns, ps);
    }
    if (taken && on_oom)
        on_oom(d->rt->name, size, &facts);
    return d->rt->err_oom;
}

/* Step: the runtime refused a region with an error other than
 * out-of-memory (no driver, a stub library). Nothing the shim can do makes
 * room for that: its own error at once, no pressure event, no OOM report. */
static int fail_other(shim_device *d, size_t size, int rt_err)
{
    atomic_fetch_add_explicit(&d->failed, 1, memory_order_relaxed);
    shim_debug("%s: the runtime refused %zu bytes with error %d", d->rt->name, size, rt_err);
    return rt_err;
}

/* The caller's shard could not serve the request: the other shards, then,
 * under the device lock, everything that makes room. No shard lock is
 * held on entry. Returns 0 with *addr and *seq, or the runtime's error. */
static int malloc_slow(shim_device *d, size_t size, bool home_grew, uint32_t nstack,
                       uint32_t pystack, uintptr_t *addr, uint64_t *seq)
{
    int rt_err;
    /* Free blocks of the other shards not busy now before a new region
     * for this one: threads that moved leave space behind in the shard
     * they left. Then every shard, growing; the caller's only if its try
     * did not (the runtime has just refused it). */
    if (serve_any(d, size, true, true, nstack, pystack, addr, seq, &rt_err))
        return 0;
    if (serve_any(d, size, false, home_grew, nstack, pystack, addr, seq, &rt_err))
        return 0;
    if (rt_err)
        return fail_other(d, size, rt_err);
    /* Already holding the device lock means a pressure callback allocates
     * before releasing it: serve it if memory is there, never start
     * pressure work. */
    bool taken = lock_unless_mine(&d->lock);
    struct relief_budget budget = {.max_rounds = shim_opts()->pressure_rounds};
    for (;;) {
        if (!taken || !make_room(d, size, &budget))
            return fail(d, size, taken);
        if (serve_any(d, size, false, false, nstack, pystack, addr, seq, &rt_err))
            break;
        if (rt_err) {
            shim_lock_release(&d->lock);
            return fail_other(d, size, rt_err);
        }
    }
    shim_lock_release(&d->lock);
    return 0;
}

static int malloc_general(shim_device *d, void **ptr, size_t size);

int shim_device_malloc(shim_device *d, void **ptr, size_t size)
{
    /* The common request, apart so that it carries only what it uses: no
     * stacks to capture, no trace, fork handlers in place, and the thread's
     * arena free. Anything else, and a failed try, take the general path. */
    if (ptr && size - 1 < (SIZE_MAX >> 1) &&
        !atomic_load_explicit(&capture_hook, memory_order_relaxed) &&
        !atomic_load_explicit(&event_hook, memory_order_relaxed) &&
        atomic_load_explicit(&d->fork_registered, memory_order_relaxed)) {
        shim_shard *s = d->shards[home_index(d)];
        if (!shim_lock_held_by_me(&s->lock) && shim_lock_try(&s->lock)) {
            uintptr_t addr;
            uint64_t seq;
            int rt_err;
            bool grow = shard_count(d) == 1;
            bool ok = serve(d, s, size, grow, 0, 0, &addr, &seq, &rt_err);
            shim_lock_release(&s->lock);
            if (!ok) {
                if (rt_err)
                    return fail_other(d, size, rt_err);
                int rc = malloc_slow(d, size, grow, 0, 0, &addr, &seq);
                if (rc != 0)
                    return rc;
            }
            *ptr = (void *)addr;
            return 0;
        }
    }
    return malloc_general(d, ptr, size);
}

__attribute__((noinline)) static int malloc_general(shim_device *d, void **ptr, size_t size)
{
    const shim_runtime *rt = d->rt;
    if (!ptr)
        return rt->err_invalid;
    if (size == 0)
        return rt->real_malloc(ptr, 0); /* whatever the runtime does */
    if (size > (SIZE_MAX >> 1)) {
        /* No device has that much; a failed request all the same. */
        atomic_fetch_add_explicit(&d->failed, 1, memory_order_relaxed);
        return rt->err_oom;
    }

    uint32_t nstack = 0, pystack = 0;
    shim_capture_fn capture = atomic_load_explicit(&capture_hook, memory_order_relaxed);
    if (capture)
        capture(&nstack, &pystack);

    bool taken;
    shim_shard *s = lock_home(d, &taken);
    uintptr_t addr;
    uint64_t seq;
    int rt_err;
    /* With one shard, as ever; with several, this shard's free blocks
     * first, then the others' (malloc_slow), then a new region. */
    bool grow = shard_count(d) == 1;
    bool ok = serve(d, s, size, grow, nstack, pystack, &addr, &seq, &rt_err);
    if (taken)
        shim_lock_release(&s->lock);
    if (!ok) {
        if (rt_err)
            return fail_other(d, size, rt_err);
        int rc = malloc_slow(d, size, grow, nstack, pystack, &addr, &seq);
        if (rc != 0)
            return rc;
    }
    shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(SHIM_EVENT_ALLOC, d->index, seq, addr, size, nstack, pystack);
    if (!atomic_load_explicit(&d->fork_registered, memory_order_relaxed) &&
        !shim_lock_held_by_me(&d->lock))
        announce_ready(d);
    *ptr = (void *)addr;
    return 0;
}

static const char *kind_name(enum shim_block_kind k)
{
    switch (k) {
    case SHIM_ADDR_FREE_START: return "double free (the block is already free)";
    case SHIM_ADDR_INTERIOR: return "pointer into the middle of a block";
    case SHIM_ADDR_LIVE_START: return "block without a live record";
    default: return "unknown pointer";
    }
}

/* The block `node` is no longer the program's. Shard lock held; `taken`:
 * by this call (so it may be dropped for a wait), not by a pressure
 * callback that frees while holding it. */
static void release_block(shim_device *d, shim_shard *s, uint32_t node, size_t size, bool taken)
{
    shim_lock_assert_held(&s->lock);
    count_free(d, s, size);
    if (!d->rt->sync_device) {
        shim_arena_free_node(s->arena, node);
        return;
    }
    size_t block = shim_arena_block_size(s->arena, node);
    if (!hold_for_device(s, node, block)) {
        /* No host memory to remember it: wait for the device now, as the
         * runtime's own free would. Without that wait (it failed, or
         * cannot be had here) the block stays out of use. */
        unsigned gen = s->generation;
        if (taken && !shim_lock_held_by_me(&d->lock) && wait_and_relock(d, s) &&
            s->generation == gen)
            shim_arena_free_node(s->arena, node);
        return;
    }
    if (taken && too_much_held(s) && !shim_lock_held_by_me(&d->lock))
        wait_and_reuse_held(d, s);
}

/* Invalid-free warnings: a program that frees garbage in a loop must not
 * flood stderr. The first few are printed, then one line says the rest are
 * not; the counters (statistics) stay exact. Process-wide, lock-free. */
#define INVALID_FREE_WARNINGS 10
static atomic_uint invalid_free_warned;

static bool invalid_free_reportable(void)
{
    if (atomic_load_explicit(&invalid_free_warned, memory_order_relaxed) > INVALID_FREE_WARNINGS)
        return false; /* and the counter never wraps around */
    unsigned nth = atomic_fetch_add_explicit(&invalid_free_warned, 1, memory_order_relaxed);
    if (nth == INVALID_FREE_WARNINGS)
        shim_warn("further invalid frees not reported (counted in invalid_frees)");
    return nth < INVALID_FREE_WARNINGS;
}

static bool owns(shim_device *d, uintptr_t addr);

/* Frees `ptr` if one of d's shards served it: 0, or the runtime's
 * invalid-value error for a pointer inside a region of d that is not a
 * live block; -1 when no region of d holds it. The caller's shard first
 * (a thread mostly frees what it allocated), unless `from` is 1: the
 * caller ruled it out. */
static int free_in_device(shim_device *d, const shim_runtime *rt, void *ptr, unsigned from)
{
    unsigned n = shard_count(d), home = home_index(d);
    for (unsigned k = from; k < n; k++) {
        shim_shard *s = d->shards[shard_after(home, k, n)];
        /* The pointer's table line starts loading while the lock is taken
         * (with another thread in, that is time the miss would not get). */
        shim_table_prefetch(s->table, (uintptr_t)ptr);
        bool taken = lock_unless_mine(&s->lock);
        /* With several shards, a block of another one (freed by a thread
         * other than the one that allocated it) costs this shard a look
         * at its few regions, not a probe of its table (a likely miss). */
        if (n > 1 && !shim_arena_contains(s->arena, (uintptr_t)ptr)) {
            if (taken)
                shim_lock_release(&s->lock);
            continue;
        }
        uint32_t node = shim_table_remove(s->table, (uintptr_t)ptr, NULL);
        shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
        if (node != SHIM_TABLE_NONE && !ev && !d->rt->sync_device) {
            /* As on the fast path: a thread freeing blocks another
             * allocated holds their shard's lock the shorter for it. */
            free_after_prefetch(d, s, node);
            if (taken)
                shim_lock_release(&s->lock);
            return 0;
        }
        if (node != SHIM_TABLE_NONE) {
            size_t size = shim_arena_block_requested(s->arena, node);
            /* The sequence number first: release_block may drop the lock
             * for a wait, and the free happened now. The stack ids too:
             * the node may be reused once released. */
            uint64_t seq = ev ? shim_device_seq_next() : 0;
            uint32_t nstack = ev ? shim_arena_tag(s->arena, node, 0) : 0;
            uint32_t pystack = ev ? shim_arena_tag(s->arena, node, 1) : 0;
            release_block(d, s, node, size, taken);
            if (taken)
                shim_lock_release(&s->lock);
            if (ev)
                ev(SHIM_EVENT_FREE, d->index, seq, (uintptr_t)ptr, size, nstack, pystack);
            return 0;
        }
        /* Not a live block: what it is, with the blocks of the frees left
         * for later told as freed (a second free of one is a double free). */
        finish_prefetched_frees(d, s);
        uintptr_t base = 0;
        size_t rsize = 0;
        enum shim_block_kind kind = shim_arena_classify(s->arena, (uintptr_t)ptr, &base, &rsize);
        if (taken)
            shim_lock_release(&s->lock);
        if (kind != SHIM_ADDR_OUTSIDE) {
            atomic_fetch_add_explicit(&d->invalid_frees, 1, memory_order_relaxed);
            if (invalid_free_reportable())
                shim_warn("%s: invalid free of %p: %s, in region %#lx + %zu; rejected", rt->name,
                          ptr, kind_name(kind), (unsigned long)base, rsize);
            return rt->err_invalid;
        }
    }
    return -1;
}

/* Frees `ptr` on device `d`. A pointer outside d's regions is looked for on
 * the other devices of its runtime when `others`, and is otherwise passed
 * to the caller's route's real free. `home_ruled_out`: the calling
 * thread's shard does not hold it. */
static int free_on_general(shim_device *d, const shim_runtime *caller, void *ptr, bool others,
                           bool home_ruled_out);

static int free_on(shim_device *d, const shim_runtime *caller, void *ptr, bool others)
{
    /* The common free, apart so that it carries only what it uses: a block
     * of the thread's own arena, free to lock, no trace to tell, no device
     * to wait for. Anything else takes the general path. */
    if (!atomic_load_explicit(&event_hook, memory_order_relaxed) && !d->rt->sync_device) {
        unsigned n = shard_count(d);
        shim_shard *s = d->shards[home_index(d)];
        shim_table_prefetch(s->table, (uintptr_t)ptr);
        if (!shim_lock_held_by_me(&s->lock) && shim_lock_try(&s->lock)) {
            bool elsewhere = n > 1 && !shim_arena_contains(s->arena, (uintptr_t)ptr);
            uint32_t node = elsewhere ? SHIM_TABLE_NONE
                                      : shim_table_remove(s->table, (uintptr_t)ptr, NULL);
            if (node != SHIM_TABLE_NONE) {
                free_after_prefetch(d, s, node);
                shim_lock_release(&s->lock);
                return 0;
            }
            shim_lock_release(&s->lock);
            /* A block of another shard (a thread freeing what another
             * allocated): the general path need not lock this one again.
             * None of its regions can have come to hold the block since:
             * the block was allocated before this free, and a region
             * holding a live block is never released. */
            if (elsewhere)
                return free_on_general(d, caller, ptr, others, true);
        }
    }
    return free_on_general(d, caller, ptr, others, false);
}

__attribute__((noinline)) static int free_on_general(shim_device *d, const shim_runtime *caller,
                                                     void *ptr, bool others, bool home_ruled_out)
{
    const shim_runtime *rt = caller;
    int rc = free_in_device(d, rt, ptr, home_ruled_out ? 1 : 0);
    if (rc >= 0)
        return rc;
    size_t n = others ? shim_device_count() : 0;
    for (size_t i = 0; i < n; i++)
        if (devices[i] != d && same_runtime(devices[i], caller) && owns(devices[i], (uintptr_t)ptr))
            return free_on(devices[i], caller, ptr, false);
    if (in_forgotten_region((uintptr_t)ptr)) {
        /* A block of a context torn down since: the runtime freed it, and
         * may have given the address to another owner since. */
        atomic_fetch_add_explicit(&d->invalid_frees, 1, memory_order_relaxed);
        if (invalid_free_reportable())
            shim_warn("%s: invalid free of %p: its context was torn down, which freed it; "
                      "rejected", rt->name, ptr);
        return rt->err_invalid;
    }
    /* Allocated before the shim took over, or by other means; unless the
     * runtime rejects it too: then it is a wild pointer. */
    rc = rt->real_free(ptr);
    if (rc == rt->err_invalid)
        atomic_fetch_add_explicit(&d->invalid_frees, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&d->foreign_frees, 1, memory_order_relaxed);
    if (rc == rt->err_invalid && invalid_free_reportable())
        shim_warn("%s: invalid free of %p: in no region of the shim, and the runtime "
                  "rejected it too", rt->name, ptr);
    return rc;
}

int shim_device_free(shim_device *d, void *ptr)
{
    if (!ptr)
        return d->rt->real_free(NULL); /* CUDA programs use cudaFree(0) to set up a context */
    return free_on(d, d->rt, ptr, false);
}

static int free_any_slow(const shim_runtime *rt, shim_device *hint, void *ptr);

int shim_device_free_any(const shim_runtime *rt, shim_device *hint, void *ptr)
{
    /* A runtime with one device (no notion of a current one) frees there
     * at once; apart, so that this path saves no registers it never uses. */
    if (ptr && !rt->current_device && hint)
        return free_on(hint, rt, ptr, true);
    return free_any_slow(rt, hint, ptr);
}

__attribute__((noinline)) static int free_any_slow(const shim_runtime *rt, shim_device *hint,
                                                   void *ptr)
{
    if (!ptr)
        return rt->real_free(NULL); /* CUDA programs use cudaFree(0) to set up a context */
    /* The caller's device first: almost every free comes from there, and a
     * hit costs one lock and one table lookup. */
    int ordinal = 0;
    uintptr_t context = 0;
    shim_device *cur = rt->current_device ? NULL : hint;
    if (!cur && rt->current_context && rt->current_context(&context) == 0 && context)
        cur = find_context(rt, context);
    else if (!cur && (!rt->current_device || rt->current_device(&ordinal, &context) == 0))
        cur = find_device(rt, ordinal, context);
    if (!cur) {
        size_t n = shim_device_count();
        for (size_t i = 0; i < n && !cur; i++)
            if (same_runtime(devices[i], rt))
                cur = devices[i];
    }
    if (!cur)
        return rt->real_free(ptr); /* no device yet: not the shim's */
    return free_on(cur, rt, ptr, true);
}

enum shim_block_state shim_device_block_info(const shim_runtime *rt, uintptr_t addr,
                                             shim_block_info *info)
{
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (!same_runtime(d, rt))
            continue;
        unsigned ns = shard_count(d);
        for (unsigned k = 0; k < ns; k++) {
            shim_shard *s = d->shards[k];
            bool taken = lock_with_frees_finished(d, s);
            enum shim_block_state st = SHIM_BLOCK_NONE;
            if (shim_arena_contains(s->arena, addr)) {
                /* Freed, waiting for the device, or slack: not the
                 * program's, whatever the region around it is. */
                st = SHIM_BLOCK_DEAD;
                uintptr_t start;
                uint32_t node = SHIM_TABLE_NONE;
                shim_live_fields f = {0};
                if (shim_arena_live_block_at(s->arena, addr, &start))
                    node = shim_table_find_fields(s->table, start, &f);
                size_t size = node != SHIM_TABLE_NONE ? shim_arena_block_requested(s->arena, node)
                                                      : 0;
                if (node != SHIM_TABLE_NONE && addr - start < size) {
                    st = SHIM_BLOCK_LIVE;
                    info->base = start;
                    info->size = size;
                    /* Apart from the driver's own buffer ids (small
                     * counters): the top bit set. */
                    info->id = f.seq | (UINT64_C(1) << 63);
                    info->context = atomic_load_explicit(&d->context, memory_order_relaxed);
                    info->ordinal = d->ordinal;
                }
            }
            if (taken)
                shim_lock_release(&s->lock);
            if (st != SHIM_BLOCK_NONE)
                return st;
        }
    }
    return in_forgotten_region(addr) ? SHIM_BLOCK_DEAD : SHIM_BLOCK_NONE;
}

int shim_device_block_range(const shim_runtime *rt, uintptr_t addr, uintptr_t *base, size_t *size)
{
    shim_block_info info;
    if (shim_device_block_info(rt, addr, &info) != SHIM_BLOCK_LIVE)
        return -1;
    *base = info.base;
    *size = info.size;
    return 0;
}

static bool owns(shim_device *d, uintptr_t addr)
{
    unsigned n = shard_count(d);
    bool in = false;
    for (unsigned k = 0; k < n && !in; k++) {
        shim_shard *s = d->shards[k];
        bool taken = lock_unless_mine(&s->lock);
        in = shim_arena_contains(s->arena, addr);
        if (taken)
            shim_lock_release(&s->lock);
    }
    return in;
}

int shim_device_mem_info(shim_device *d, size_t *free_out, size_t *total_out)
{
    const shim_runtime *rt = d->rt;
    if (!free_out || !total_out)
        return rt->err_invalid;
    uint64_t reserved = 0, used = 0;
    size_t limit = 0;
    unsigned n = shard_count(d);
    for (unsigned k = 0; k < n; k++) {
        shim_shard *s = d->shards[k];
        bool taken = lock_with_frees_finished(d, s);
        shim_arena_counters c;
        shim_arena_get_counters(s->arena, &c);
        if (k == 0)
            limit = shim_arena_limit(s->arena); /* the arena may change at a teardown */
        reserved += c.reserved_bytes;
        /* Blocks waiting for the device are the program's to have again. */
        used += c.used_bytes >= s->held_bytes ? c.used_bytes - s->held_bytes : 0;
        if (taken)
            shim_lock_release(&s->lock);
    }
    /* The runtime's free memory after the settling above: settling a free
     * can give a cached empty region back, which the runtime then counts
     * as free and the counters no longer count as reserved (asked before,
     * one region went missing from the sum). */
    size_t rfree = 0, rtotal = 0;
    int rc = backend_mem_info(d, &rfree, &rtotal);
    if (rc != 0)
        return rc;

    /* The shim's view: what the program could still get. The runtime's
     * free memory plus the unused part of the shim's regions, capped by
     * the limit; never more than total, never below zero. */
    size_t total = rtotal;
    if (limit && limit < total)
        total = limit;
    uint64_t inside = reserved > used ? reserved - used : 0;
    uint64_t avail = (uint64_t)rfree + inside;
    if (limit) {
        uint64_t room = limit > used ? limit - used : 0;
        if (avail > room)
            avail = room;
    }
    if (avail > total)
        avail = total;
    *free_out = (size_t)avail;
    *total_out = total;
    return 0;
}

struct live_ctx {
    shim_record *out;
    size_t n, cap;
    uint64_t since;
    const shim_arena *arena;
};

static void collect_live(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user)
{
    struct live_ctx *c = user;
    if (f->seq <= c->since || c->n == c->cap)
        return;
    c->out[c->n++] = (shim_record){
        .ptr = ptr,
        .size = shim_arena_block_requested(c->arena, id),
        .seq = f->seq,
        .node = id,
        .native_stack = shim_arena_tag(c->arena, id, 0),
        .python_stack = shim_arena_tag(c->arena, id, 1),
    };
}

shim_record *shim_device_live(shim_device *d, uint64_t since, size_t *n)
{
    *n = 0;
    struct live_ctx c = {.since = since};
    unsigned ns = shard_count(d);
    for (unsigned k = 0; k < ns; k++) {
        shim_shard *s = d->shards[k];
        bool taken = lock_with_frees_finished(d, s);
        size_t count = shim_table_count(s->table);
        if (c.n + count > c.cap) {
            size_t cap = c.n + count;
            shim_record *o = realloc(c.out, (cap ? cap : 1) * sizeof *o);
            if (!o) {
                if (taken)
                    shim_lock_release(&s->lock);
                free(c.out);
                return NULL;
            }
            c.out = o;
            c.cap = cap;
        }
        c.arena = s->arena;
        shim_table_foreach(s->table, collect_live, &c);
        if (taken)
            shim_lock_release(&s->lock);
    }
    if (!c.out)
        c.out = malloc(sizeof *c.out);
    *n = c.n;
    return c.out;
}

void shim_device_add_stats(shim_device *d, spyreshim_stats *st)
{
    unsigned ns = shard_count(d);
    uint64_t live = 0, peak = 0;
    for (unsigned k = 0; k < ns; k++) {
        shim_shard *s = d->shards[k];
        bool taken = lock_with_frees_finished(d, s);
        shim_arena_counters c;
        shim_arena_get_counters(s->arena, &c);
        st->reserved_bytes += c.reserved_bytes;
        st->regions += c.regions;
        st->regions_reserved += c.regions_reserved;
        st->regions_released += c.regions_released;
        st->allocs += s->allocs;
        st->frees += s->frees;
        live += s->live_bytes;
        if (s->peak_live_bytes > peak)
            peak = s->peak_live_bytes;
        if (taken)
            shim_lock_release(&s->lock);
    }
    /* One shard keeps the exact peak; several publish theirs in steps. */
    if (ns > 1) {
        uint64_t p = atomic_load_explicit(&d->peak_total, memory_order_relaxed);
        if (p > peak)
            peak = p;
        if (live > peak)
            peak = live;
    }
    st->arenas += ns;
    st->used_bytes += live;
    st->peak_used_bytes += peak;
    st->peak_reserved_bytes += atomic_load_explicit(&d->pool.peak_reserved, memory_order_relaxed);
    st->failed_allocs += atomic_load_explicit(&d->failed, memory_order_relaxed);
    st->invalid_frees += atomic_load_explicit(&d->invalid_frees, memory_order_relaxed);
    st->foreign_frees += atomic_load_explicit(&d->foreign_frees, memory_order_relaxed);
    st->device_waits += atomic_load_explicit(&d->device_waits, memory_order_relaxed);
    uint64_t torn = atomic_load_explicit(&d->teardown_blocks, memory_order_relaxed);
    st->allocs += torn; /* left the shards' counts when forgotten */
    st->context_teardown_blocks += torn;
    st->context_teardown_bytes += atomic_load_explicit(&d->teardown_bytes, memory_order_relaxed);
    bool taken = lock_unless_mine(&d->lock);
    st->pressure_events += d->ps.events;
    st->pressure_waits += d->ps.waits;
    st->callback_runs += d->ps.callback_runs;
    st->callback_recovered_bytes += d->ps.recovered_bytes;
    st->pressure_wait_timeouts += d->ps.wait_timeouts;
    if (taken)
        shim_lock_release(&d->lock);
}

/* Bytes freed through the shim on every device so far: what a pressure
 * event measures its callbacks by, and the collector its collections.
 * Each shard settled first, under its lock: a single free a callback made
 * may still be the one free_after_prefetch left. */
static uint64_t freed_everywhere(void)
{
    uint64_t sum = 0;
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        unsigned ns = shard_count(d);
        for (unsigned k = 0; k < ns; k++) {
            shim_shard *s = d->shards[k];
            bool taken = lock_with_frees_finished(d, s);
            sum += s->freed_bytes;
            if (taken)
                shim_lock_release(&s->lock);
        }
    }
    return sum;
}

/* fork(): what a device does; when, and in which order with every other
 * lock of the process, is shim/process/fork.c's (docs/locking.md). */

/* Device i as the fork handlers see it: the acquire load of the count pairs
 * with the release store that published the device (the handlers were
 * installed by another thread, through glibc's own lock). */
static shim_device *device_slot(size_t i)
{
    return i < atomic_load_explicit(&ndevices, memory_order_acquire) ? devices[i] : NULL;
}

/* The device lock, then every shard's, in index order (docs/locking.md). */
void shim_device_fork_prepare(size_t i)
{
    shim_device *d = device_slot(i);
    if (!d)
        return;
    shim_lock_acquire(&d->lock);
    unsigned n = shard_count(d);
    for (unsigned k = 0; k < n; k++)
        shim_lock_acquire(&d->shards[k]->lock);
    d->fork_nshards = n;
    d->fork_locked = true;
}

static void fork_unlock(shim_device *d)
{
    d->fork_locked = false;
    for (unsigned k = d->fork_nshards; k-- > 0;)
        shim_lock_release(&d->shards[k]->lock);
    shim_lock_release(&d->lock);
}

void shim_device_fork_parent(size_t i)
{
    shim_device *d = device_slot(i);
    if (!d || !d->fork_locked)
        return;
    fork_unlock(d);
}

static void reset_pressure(shim_device *d)
{
    shim_pressure_state_atfork_child(&d->ps);
}

void shim_device_fork_child(size_t i)
{
    shim_device *d = device_slot(i);
    if (!d || !d->fork_locked)
        return;
    reset_pressure(d);
    fork_unlock(d);
}

static void announce_ready(shim_device *d)
{
    if (atomic_exchange(&d->fork_registered, true))
        return;
    shim_device_ready_fn fn = atomic_load(&ready_hook);
    size_t n = shim_device_count();
    for (size_t i = 0; i < n && fn; i++)
        if (devices[i] == d)
            fn(i);
}

void shim_device_set_ready_hook(shim_device_ready_fn fn)
{
    atomic_store(&ready_hook, fn);
}

void shim_device_atfork_child_early(void)
{
    /* A device whose fork handlers were not installed yet (fork during its
     * very first allocation) may have been locked by another thread: there
     * is nothing better to do than to start its lock afresh. */
    pthread_mutex_init(&devices_mu, NULL);
    /* The forking thread's batch may hold numbers the child, one thread
     * again, hands out from the counter. */
    atomic_fetch_add_explicit(&seq_epoch, 1, memory_order_relaxed);
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (!d->fork_locked) {
            shim_lock_init(&d->lock);
            for (unsigned k = 0; k < shard_count(d); k++)
                shim_lock_init_fast(&d->shards[k]->lock);
            reset_pressure(d);
        }
    }
}

void shim_device_publish_lock(void) { shim_mutex_lock(&publish_mu); }
void shim_device_publish_unlock(void) { shim_mutex_unlock(&publish_mu); }

/* Taken, not started afresh: a publisher holds it only while it fills its
 * runtime's entry points and creates the device (calloc, devices_mu, no
 * loader call, no allocator lock), so prepare's wait is short, and the
 * child finds every runtime either published or untouched. */
void shim_device_publish_atfork_prepare(void)
{
    shim_mutex_lock(&publish_mu);
    shim_mutex_lock(&forgotten_mu); /* a leaf, held for a few stores */
}

void shim_device_publish_atfork_parent(void)
{
    shim_mutex_unlock(&forgotten_mu);
    shim_mutex_unlock(&publish_mu);
}

void shim_device_publish_atfork_child(void)
{
    shim_mutex_unlock(&forgotten_mu);
    shim_mutex_unlock(&publish_mu);
}
