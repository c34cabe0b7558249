/* One intercepted runtime: its arena, its live table, its allocator lock
 * and its pressure state. Every entry point of hooks/ lands here.
 *
 * Lock: `lock` guards the arena, the table, the pressure state and the
 * counters below. It is held across the runtime's own region reserve and
 * release (so a region cannot be handed out twice), never across stack
 * capture, logging of leak reports, or a foreign pointer's real free.
 * Never dereferences a device address. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "device.h"
#include "lock.h"
#include "log.h"
#include "mutex.h"
#include "options.h"
#include "pressure.h"

struct shim_device {
    const shim_runtime *rt;
    spyreshim_lock lock;
    shim_arena *arena;
    shim_table *table;
    shim_region_backend backend;
    shim_pressure_state ps;
    _Atomic bool fork_registered; /* announced ready: its fork handlers are installed */
    bool fork_locked;             /* its fork prepare handler holds `lock` */
    /* Guarded by lock. */
    uint64_t allocs, frees, failed, invalid_frees, foreign_frees;
    uint64_t live_bytes, peak_live_bytes; /* bytes the program asked for */
};

/* Leak hunting's hooks, set once at init by the layer above (the allocator
 * knows nothing of stacks or reports); NULL while leak hunting is off. */
static _Atomic(shim_capture_fn) capture_hook;
static _Atomic(shim_oom_fn) oom_hook;
static _Atomic(shim_device_ready_fn) ready_hook;

static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
static shim_device *devices[SHIM_MAX_DEVICES];
static _Atomic size_t ndevices;
static _Atomic uint64_t seq_counter;

static int backend_reserve(void *ctx, size_t size, uintptr_t *addr)
{
    shim_device *d = ctx;
    void *p = NULL;
    int rc = d->rt->real_malloc(&p, size);
    if (rc != 0 || !p)
        return rc ? rc : d->rt->err_oom;
    *addr = (uintptr_t)p;
    shim_debug("%s: reserved region %p + %zu", d->rt->name, p, size);
    return 0;
}

static void backend_release(void *ctx, uintptr_t addr, size_t size)
{
    shim_device *d = ctx;
    int rc = d->rt->real_free((void *)addr);
    if (rc != 0)
        shim_warn("%s: the runtime refused to free region %#lx + %zu (error %d)",
                  d->rt->name, (unsigned long)addr, size, rc);
    else
        shim_debug("%s: released region %#lx + %zu", d->rt->name, (unsigned long)addr, size);
}

static int backend_mem_info(void *ctx, size_t *free, size_t *total)
{
    shim_device *d = ctx;
    return d->rt->real_mem_info(free, total);
}


static shim_device *device_create(const shim_runtime *rt)
{
    shim_device *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->rt = rt;
    shim_lock_init(&d->lock);
    shim_pressure_state_init(&d->ps);
    d->backend = (shim_region_backend){
        .ctx = d,
        .reserve = backend_reserve,
        .release = backend_release,
        .mem_info = backend_mem_info,
        .alignment = rt->alignment,
    };
    const shim_options *o = shim_opts();
    d->arena = shim_arena_create(&d->backend, o->limit, o->region_size);
    d->table = shim_table_create(1024);
    if (!d->arena || !d->table) {
        if (d->arena)
            shim_arena_destroy(d->arena);
        if (d->table)
            shim_table_destroy(d->table);
        free(d);
        return NULL;
    }
    return d;
}

void shim_device_set_leak_hooks(shim_capture_fn capture, shim_oom_fn on_oom)
{
    atomic_store(&oom_hook, on_oom);
    atomic_store(&capture_hook, capture);
}

shim_device *shim_device_get(const shim_runtime *rt)
{
    size_t n = atomic_load_explicit(&ndevices, memory_order_acquire);
    for (size_t i = 0; i < n; i++)
        if (devices[i]->rt == rt)
            return devices[i];

    shim_mutex_lock(&devices_mu);
    shim_device *d = NULL;
    n = atomic_load_explicit(&ndevices, memory_order_relaxed);
    for (size_t i = 0; i < n && !d; i++)
        if (devices[i]->rt == rt)
            d = devices[i];
    if (!d && n < SHIM_MAX_DEVICES) {
        d = device_create(rt);
        if (d) {
            devices[n] = d;
            atomic_store_explicit(&ndevices, n + 1, memory_order_release);
            shim_debug("%s: serving allocations (limit %zu bytes)", rt->name, shim_opts()->limit);
        }
    }
    shim_mutex_unlock(&devices_mu);
    return d;
}

const char *shim_device_name(const shim_device *d)
{
    return d->rt->name;
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
    return atomic_load_explicit(&seq_counter, memory_order_relaxed);
}

/* Takes the lock unless this thread holds it already: a pressure callback
 * that frees (or allocates) before releasing the lock must not deadlock on
 * itself. Returns whether it was taken here. */
static bool lock_unless_mine(shim_device *d)
{
    if (shim_lock_held_by_me(&d->lock))
        return false;
    shim_lock_acquire(&d->lock);
    return true;
}

static bool has_empty_regions(const shim_device *d)
{
    shim_arena_counters c;
    shim_arena_get_counters(d->arena, &c);
    return c.empty_regions > 0;
}

static void announce_ready(shim_device *d);

/* Step: one try at serving the request from the arena, recording the
 * block. Lock held. False when no block fits (or the table could not grow:
 * out of host memory, reported as out-of-memory too). */
static bool serve(shim_device *d, size_t size, uint32_t nstack, uint32_t pystack, uintptr_t *out)
{
    uintptr_t addr;
    uint32_t node;
    size_t block;
    if (shim_arena_alloc(d->arena, size, &addr, &node, &block) != 0)
        return false;
    shim_record rec = {
        .ptr = addr,
        .size = size,
        .seq = atomic_fetch_add_explicit(&seq_counter, 1, memory_order_relaxed) + 1,
        .node = node,
        .native_stack = nstack,
        .python_stack = pystack,
    };
    if (shim_table_insert(d->table, &rec) != 0) {
        shim_arena_free_node(d->arena, node);
        return false;
    }
    d->allocs++;
    d->live_bytes += size;
    if (d->live_bytes > d->peak_live_bytes)
        d->peak_live_bytes = d->live_bytes;
    *out = addr;
    return true;
}

/* What a request has spent on getting memory back. Rounds count the
 * events it ran; waits for another thread's event count apart, with a
 * larger bound: under heavy concurrency a thread can lose what each event
 * freed to others a few times in a row without anything being wrong. */
struct relief_budget {
    unsigned rounds, waits, max_rounds;
    bool trimmed;
};

/* Step: after a failed try, makes room if anything still can. Lock held
 * (a pressure event releases and re-acquires it). False when the request
 * must fail. */
static bool make_room(shim_device *d, size_t size, struct relief_budget *b)
{
    if (shim_pressure_in_event())
        return false; /* an allocation made by pressure work itself */
    /* Cached empty regions are free memory the runtime cannot see: give
     * them back first, so a larger region can be reserved. */
    if (!b->trimmed && has_empty_regions(d)) {
        b->trimmed = true;
        shim_arena_trim(d->arena, 0);
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

/* Step: the request failed for good. Called with the lock held when
 * `taken`, returns without it. */
static int fail(shim_device *d, size_t size, bool taken)
{
    d->failed++;
    if (taken)
        shim_lock_release(&d->lock);
    shim_debug("%s: out of memory for %zu bytes", d->rt->name, size);
    shim_oom_fn on_oom = atomic_load_explicit(&oom_hook, memory_order_relaxed);
    if (taken && on_oom)
        on_oom(d->rt->name, size);
    return d->rt->err_oom;
}

int shim_device_malloc(shim_device *d, void **ptr, size_t size)
{
    const shim_runtime *rt = d->rt;
    if (!ptr)
        return rt->err_invalid;
    if (size == 0)
        return rt->real_malloc(ptr, 0); /* whatever the runtime does */
    if (size > (SIZE_MAX >> 1))
        return rt->err_oom;

    uint32_t nstack = 0, pystack = 0;
    shim_capture_fn capture = atomic_load_explicit(&capture_hook, memory_order_relaxed);
    if (capture)
        capture(&nstack, &pystack);

    /* Already holding the lock means a callback allocates before releasing
     * it: serve it if memory is there, never start pressure work. */
    bool taken = lock_unless_mine(d);
    struct relief_budget budget = {.max_rounds = shim_opts()->pressure_rounds};
    uintptr_t addr;
    while (!serve(d, size, nstack, pystack, &addr))
        if (!taken || !make_room(d, size, &budget))
            return fail(d, size, taken);
    if (taken)
        shim_lock_release(&d->lock);
    if (taken && !atomic_load_explicit(&d->fork_registered, memory_order_relaxed))
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

int shim_device_free(shim_device *d, void *ptr)
{
    const shim_runtime *rt = d->rt;
    if (!ptr)
        return rt->real_free(NULL); /* CUDA programs use cudaFree(0) to set up a context */

    bool taken = lock_unless_mine(d);
    shim_record rec;
    if (shim_table_remove(d->table, (uintptr_t)ptr, &rec)) {
        shim_arena_free_node(d->arena, rec.node);
        d->frees++;
        d->live_bytes -= rec.size;
        if (taken)
            shim_lock_release(&d->lock);
        shim_pressure_note_freed(rec.size);
        return 0;
    }
    uintptr_t base = 0;
    size_t rsize = 0;
    enum shim_block_kind k = shim_arena_classify(d->arena, (uintptr_t)ptr, &base, &rsize);
    if (k == SHIM_ADDR_OUTSIDE) {
        d->foreign_frees++;
        if (taken)
            shim_lock_release(&d->lock);
        /* Allocated before the shim took over, or by other means. */
        return rt->real_free(ptr);
    }
    d->invalid_frees++;
    if (taken)
        shim_lock_release(&d->lock);
    shim_warn("%s: invalid free of %p: %s, in region %#lx + %zu; rejected", rt->name, ptr,
              kind_name(k), (unsigned long)base, rsize);
    return rt->err_invalid;
}

int shim_device_mem_info(shim_device *d, size_t *free_out, size_t *total_out)
{
    const shim_runtime *rt = d->rt;
    if (!free_out || !total_out)
        return rt->err_invalid;
    size_t rfree = 0, rtotal = 0;
    int rc = rt->real_mem_info(&rfree, &rtotal);
    if (rc != 0)
        return rc;
    bool taken = lock_unless_mine(d);
    shim_arena_counters c;
    shim_arena_get_counters(d->arena, &c);
    if (taken)
        shim_lock_release(&d->lock);

    /* The shim's view: what the program could still get. The runtime's
     * free memory plus the unused part of the shim's regions, capped by
     * the limit; never more than total, never below zero. */
    size_t total = rtotal;
    size_t limit = shim_arena_limit(d->arena);
    if (limit && limit < total)
        total = limit;
    uint64_t inside = c.reserved_bytes > c.used_bytes ? c.reserved_bytes - c.used_bytes : 0;
    uint64_t avail = (uint64_t)rfree + inside;
    if (limit) {
        uint64_t room = limit > c.used_bytes ? limit - c.used_bytes : 0;
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
};

static void collect_live(const shim_record *r, void *user)
{
    struct live_ctx *c = user;
    if (r->seq <= c->since || c->n == c->cap)
        return;
    c->out[c->n++] = *r;
}

shim_record *shim_device_live(shim_device *d, uint64_t since, size_t *n)
{
    *n = 0;
    bool taken = lock_unless_mine(d);
    size_t count = shim_table_count(d->table);
    struct live_ctx c = {.out = malloc((count ? count : 1) * sizeof(shim_record)),
                         .cap = count, .since = since};
    if (c.out)
        shim_table_foreach(d->table, collect_live, &c);
    if (taken)
        shim_lock_release(&d->lock);
    *n = c.n;
    return c.out;
}

void shim_device_add_stats(shim_device *d, spyreshim_stats *s)
{
    bool taken = lock_unless_mine(d);
    shim_arena_counters c;
    shim_arena_get_counters(d->arena, &c);
    s->reserved_bytes += c.reserved_bytes;
    s->used_bytes += d->live_bytes;
    s->peak_reserved_bytes += c.peak_reserved_bytes;
    s->peak_used_bytes += d->peak_live_bytes;
    s->regions += c.regions;
    s->regions_reserved += c.regions_reserved;
    s->regions_released += c.regions_released;
    s->allocs += d->allocs;
    s->frees += d->frees;
    s->failed_allocs += d->failed;
    s->invalid_frees += d->invalid_frees;
    s->foreign_frees += d->foreign_frees;
    s->pressure_events += d->ps.events;
    s->pressure_waits += d->ps.waits;
    s->callback_runs += d->ps.callback_runs;
    s->callback_recovered_bytes += d->ps.recovered_bytes;
    s->pressure_wait_timeouts += d->ps.wait_timeouts;
    if (taken)
        shim_lock_release(&d->lock);
}

size_t shim_device_trim(shim_device *d)
{
    bool taken = lock_unless_mine(d);
    size_t n = shim_arena_trim(d->arena, 0);
    if (taken)
        shim_lock_release(&d->lock);
    return n;
}

/* fork(): what a device does; when, and in which order with every other
 * lock of the process, is shim/process/fork.c's (docs/locking.md). */
void shim_device_fork_prepare(size_t i)
{
    shim_device *d = devices[i];
    shim_lock_acquire(&d->lock);
    d->fork_locked = true;
}

void shim_device_fork_parent(size_t i)
{
    shim_device *d = devices[i];
    d->fork_locked = false;
    shim_lock_release(&d->lock);
}

static void reset_pressure(shim_device *d)
{
    shim_pressure_state_atfork_child(&d->ps);
}

void shim_device_fork_child(size_t i)
{
    shim_device *d = devices[i];
    reset_pressure(d);
    d->fork_locked = false;
    shim_lock_release(&d->lock);
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
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (!d->fork_locked) {
            shim_lock_init(&d->lock);
            reset_pressure(d);
        }
    }
}

void shim_device_reset_for_tests(void)
{
    shim_mutex_lock(&devices_mu);
    atomic_store(&ndevices, 0);
    shim_mutex_unlock(&devices_mu);
}
