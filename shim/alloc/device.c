/* The device: one device of an intercepted runtime (with CUDA, one live
 * context of a device: its regions are that context's, the runtime frees
 * them when the context goes, context.c), created on first use with its
 * first shard and added to the registry (registry.c), found by runtime,
 * ordinal and context; its backend (the runtime's reserve, release and
 * memory info as the arenas call them). The rest of a device is in the
 * files docs/architecture.md lists beside this one (device_internal.h
 * holds the records they share).
 *
 * Locks: devices_mu (registry.c) guards the creation of devices and which
 * context a device serves (taken after the device lock and arena locks by
 * a teardown; it takes only the arena and table creation). The backend
 * runs under an arena lock, which it holds across the runtime's reserve
 * and release. Never dereferences a device address; never calls the
 * runtime with devices_mu held. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "device_internal.h"
#include "forgotten.h"
#include "log.h"
#include "options.h"

__thread __attribute__((tls_model("initial-exec"))) unsigned tls_in_backend;

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
    /* The runtime may give a forgotten address back out: live again. */
    shim_forgotten_reserved(*addr, size);
    return 0;
}

static void backend_release(void *ctx, uintptr_t addr, size_t size)
{
    shim_device *d = ctx;
    region_event(d, SHIM_EVENT_SEGMENT_FREE, addr, size);
    if (d->forgetting) {
        /* Its context's teardown: the runtime frees the region itself. */
        shim_forgotten_add(addr, size);
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

/* Not while the calling thread may be inside a stream capture. */
static bool backend_may_release(void *ctx)
{
    shim_device *d = ctx;
    return !d->rt->in_capture || !d->rt->in_capture();
}

static int backend_mem_info(void *ctx, size_t *free, size_t *total)
{
    shim_device *d = ctx;
    tls_in_backend++;
    int rc = d->rt->real_mem_info(free, total);
    tls_in_backend--;
    return rc;
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
        .may_release = backend_may_release,
        .mem_info = backend_mem_info,
        .alignment = rt->alignment,
    };
    d->max_shards = shim_shard_default_count();
    d->shards[0] = shim_shard_create(d);
    if (!d->shards[0]) {
        free(d);
        return NULL;
    }
    atomic_store_explicit(&d->nshards, 1, memory_order_release);
    shim_pressure_set_freed_source(freed_everywhere);
    return d;
}

/* Asked on the thread that first uses the device (its context current),
 * after devices_mu and the publish lock are released: the runtime's call
 * is never made under a lock of ours (the runtime's fork handlers take its
 * own lock before the shim's take the publish lock). For readers of the
 * trace (headroom per rank). */
/* Set while this thread holds the publish lock (shim_device_defer_capacity). */
static __thread bool capacity_deferred;

void shim_device_defer_capacity(bool on) { capacity_deferred = on; }

void shim_device_learn_capacity(shim_device *d)
{
    if (!d || atomic_exchange_explicit(&d->capacity_asked, true, memory_order_acq_rel))
        return;
    size_t free_b = 0, total = 0;
    uint64_t cap = shim_opts()->limit;
    if (d->rt->real_mem_info && d->backend.mem_info(d->backend.ctx, &free_b, &total) == 0 &&
        total && (!cap || total < cap))
        cap = total;
    atomic_store_explicit(&d->capacity, cap, memory_order_release);
}

uint64_t shim_device_capacity(const shim_device *d)
{
    return atomic_load_explicit(&d->capacity, memory_order_acquire);
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
    bool created = false;
    if (!d && n < SHIM_MAX_DEVICES) {
        unsigned others = 0;
        for (size_t i = 0; i < n; i++)
            others += devices[i]->ordinal == ordinal && same_runtime(devices[i], rt);
        d = device_create(rt, ordinal, context, others);
        created = d != NULL;
        if (d) {
            d->index = (unsigned)n;
            devices[n] = d;
            atomic_store_explicit(&ndevices, n + 1, memory_order_release);
            shim_debug("%s: serving allocations (limit %zu bytes, up to %u arenas)", d->name,
                       shim_opts()->limit, d->max_shards);
        }
    }
    shim_mutex_unlock(&devices_mu);
    if (d && created && !capacity_deferred)
        shim_device_learn_capacity(d);
    return d;
}

shim_device *shim_device_of_ordinal(const shim_runtime *rt, int ordinal)
{
    size_t n = atomic_load_explicit(&ndevices, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        uintptr_t c = atomic_load_explicit(&devices[i]->context, memory_order_acquire);
        if (devices[i]->ordinal == ordinal && c != SHIM_CONTEXT_VACANT && same_runtime(devices[i], rt))
            return devices[i];
    }
    return NULL;
}

shim_device *shim_device_get(const shim_runtime *rt)
{
    return shim_device_get_ordinal(rt, 0);
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

const char *shim_device_name(const shim_device *d)
{
    return d->name;
}
