/* The limit of memory the shim passes through (passthrough.c's families:
 * managed, VMM physical allocations, host-pinned): charging a request's
 * bytes to an account before the runtime is asked, and giving them back
 * when the runtime refused or freed them.
 *
 * Two kinds of account. A device's: the pool its arenas take their
 * region shares from (pool.c), so that served regions and passed-through
 * bytes together stay under SPYRESHIM_LIMIT; room is made as for a served
 * request (room.c: held blocks, trimmed regions, a pressure event under the
 * capture and gate policy). The host's: a pool of its own under
 * SPYRESHIM_HOST_LIMIT (host-pinned memory is no device's), with its own
 * lock and pressure state for its events.
 *
 * Locks: a charge takes nothing while the limit has room (the pool is
 * atomics); past it, the account's lock (a device's, or host_lock, taken
 * before nothing of the allocator's: a leaf but for the pressure event it
 * runs, which releases it around what blocks). Never called with a shim
 * lock held (a pressure callback holding the device lock fails at once
 * instead). Never calls the runtime but through room.c's wait for the
 * device. */
#include <stdatomic.h>

#include "device_internal.h"
#include "log.h"
#include "options.h"
#include "passthrough.h"
#include "pool.h"

/* The host account: pool, lock and pressure state of host-pinned memory. */
static shim_arena_pool host_pool;
static spyreshim_lock host_lock;
static shim_pressure_state host_ps;
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static _Atomic uint64_t host_failed;

static void host_init(void)
{
    shim_lock_init(&host_lock);
    shim_pressure_state_init(&host_ps);
}

/* The failed request, told to the trace as an out-of-memory event of
 * `device` (an index of shim_device_at, or TRACE's none). */
static void told_failed(unsigned device, size_t bytes)
{
    shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (!ev)
        return;
    uint32_t ns = 0, ps = 0;
    shim_capture_fn capture = atomic_load_explicit(&capture_hook, memory_order_relaxed);
    if (capture)
        capture(&ns, &ps);
    ev(SHIM_EVENT_OOM, device, shim_device_seq_next(), 0, bytes, ns, ps);
}

/* The out-of-memory report of a refused charge (the leak room's, as for
 * a served request): the limit, what the account holds, what the
 * runtime says of the device. */
static void report_failed(shim_device *d, size_t bytes, size_t limit)
{
    shim_oom_fn on_oom = atomic_load_explicit(&oom_hook, memory_order_relaxed);
    if (!on_oom)
        return;
    shim_oom_facts facts = {
        .request = bytes,
        .limit = limit,
        .reserved = atomic_load_explicit(&d->pool.reserved, memory_order_relaxed),
    };
    size_t dfree = 0, dtotal = 0;
    facts.device_known = d->rt->real_mem_info &&
                         d->backend.mem_info(d->backend.ctx, &dfree, &dtotal) == 0;
    facts.device_free = facts.device_known ? dfree : 0;
    facts.device_total = facts.device_known ? dtotal : 0;
    on_oom(d->rt->name, bytes, &facts);
}

int shim_passthrough_charge(shim_device *d, size_t bytes)
{
    size_t limit = shim_opts()->limit;
    if (shim_pool_take(&d->pool, limit, bytes))
        return 0;
    /* Over the limit: make room as a served request would, under the
     * device lock; not for a request that pressure work itself makes (a
     * callback's, or a finalizer's during a collection): it fails at once,
     * without waiting for any account's lock (an event on another thread
     * may need what this thread holds). */
    bool taken = !shim_pressure_in_event() && lock_unless_mine(&d->lock);
    bool ok = false;
    struct relief_budget budget = {.max_rounds = shim_opts()->pressure_rounds};
    while (taken && !ok && shim_device_make_room(d, bytes, &budget))
        ok = shim_pool_take(&d->pool, limit, bytes);
    if (taken)
        shim_lock_release(&d->lock);
    if (ok)
        return 0;
    atomic_fetch_add_explicit(&d->failed, 1, memory_order_relaxed);
    shim_debug("%s: out of memory for %zu passed-through bytes (limit %zu)", d->name, bytes, limit);
    told_failed(d->index, bytes);
    if (taken)
        report_failed(d, bytes, limit);
    return d->rt->err_oom;
}

void shim_passthrough_uncharge(shim_device *d, size_t bytes)
{
    shim_pool_give(&d->pool, bytes);
}

bool shim_passthrough_charge_host(size_t bytes)
{
    size_t limit = shim_opts()->host_limit;
    if (shim_pool_take(&host_pool, limit, bytes))
        return true;
    pthread_once(&host_once, host_init);
    bool taken = !shim_pressure_in_event() && lock_unless_mine(&host_lock);
    bool ok = false;
    unsigned rounds = 0, waits = 0, max = shim_opts()->pressure_rounds;
    while (taken && !ok && rounds < max && waits < 4 * max) {
        enum shim_relief r = shim_pressure_relieve(&host_ps, &host_lock, bytes);
        if (r == SHIM_RELIEF_NONE)
            break;
        if (r == SHIM_RELIEF_RAN)
            rounds++;
        else
            waits++;
        ok = shim_pool_take(&host_pool, limit, bytes);
    }
    if (taken)
        shim_lock_release(&host_lock);
    if (ok)
        return true;
    atomic_fetch_add_explicit(&host_failed, 1, memory_order_relaxed);
    shim_debug("cuda-host-pinned: out of memory for %zu bytes (SPYRESHIM_HOST_LIMIT %zu)", bytes,
               limit);
    return false;
}

void shim_passthrough_uncharge_host(size_t bytes)
{
    shim_pool_give(&host_pool, bytes);
}

uint64_t shim_passthrough_host_failed(void)
{
    return atomic_load_explicit(&host_failed, memory_order_relaxed);
}

int shim_passthrough_ordinal(const shim_device *d)
{
    return d->ordinal;
}

shim_pt_account shim_passthrough_account(shim_device *d)
{
    return shim_passthrough_account_of(d->ordinal, (int)d->index, &d->pool);
}

void shim_passthrough_add_charged(enum shim_pt_family f, shim_device *d, uintptr_t ptr,
                                  size_t size)
{
    if (d)
        shim_passthrough_add_pooled(f, d->ordinal, (int)d->index, &d->pool, ptr, size);
    else
        shim_passthrough_add_pooled(f, -1, -1, &host_pool, ptr, size);
}

/* fork(): a host event of a thread that does not exist in the child never
 * ends, and its lock would stay held: both start anew there. */
void shim_passthrough_charge_atfork_child(void)
{
    shim_lock_init(&host_lock);
    shim_pressure_state_atfork_child(&host_ps);
}
