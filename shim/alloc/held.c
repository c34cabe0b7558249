/* The device's free semantics: a runtime with asynchronous work (CUDA)
 * may still be using a block the program freed, so the block is held
 * (held_block, out of the arena's reach) until a wait for the device,
 * on every live context of its device (served in or not), covers its free;
 * past HELD_MAX_BLOCKS or 1/HELD_MAX_FRACTION of the reserved bytes, a free
 * waits and reuses what is held. A context found gone during a wait is torn
 * down (context.c).
 *
 * Locks: the held list of a shard is guarded by its shard lock; a wait for
 * the device is never made with an allocator lock held (the waits here
 * drop the shard or device lock around it and take it again). Never
 * reuses a block before a successful wait covered its free. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>

#include "device_internal.h"
#include "log.h"

/* Lets the device catch up with every free made before the call: a block
 * of one context may be used by work queued in any context of its device,
 * so every live context of d's device is waited for: those the shim served
 * in, and those the runtime knows the program made (contexts_of); none is
 * made for the wait. A context found gone is torn
 * down (its blocks, d's own among them when it is d's, are forgotten).
 * Called without any allocator lock held by this thread (the wait blocks).
 * True when every wait succeeded; on another failure warns once and
 * returns false: the blocks stay held (the device may still write
 * them); false without a word while the thread may be capturing. */
__attribute__((noinline)) static bool wait_for_device(shim_device *d)
{
    /* Inside a stream capture a wait would be captured or invalidate the
     * capture: the blocks stay held, quietly, until a wait after it. */
    if (d->rt->in_capture && d->rt->in_capture())
        return false;
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
            shim_context_forget(ctxs[i]);
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
    /* The contexts of the device where nothing was served: the runtime
     * knows them, and their queued work may use the block too. */
    uintptr_t others[64];
    size_t k = mine && d->rt->contexts_of ? d->rt->contexts_of(d->ordinal, others, 64) : 0;
    for (size_t i = 0; i < k; i++) {
        bool served = false;
        for (size_t j = 0; j < m && !served; j++)
            served = atomic_load_explicit(&ctxs[j]->context, memory_order_acquire) == others[i];
        if (served)
            continue;
        tls_in_backend++;
        int rc = d->rt->sync_device(d->ordinal, others[i]);
        tls_in_backend--;
        if (rc != 0 && rc != SHIM_SYNC_GONE) {
            ok = false;
            static _Atomic bool warned;
            if (!atomic_exchange(&warned, true))
                shim_warn("%s: waiting for another context of the device failed (error %d); "
                          "the blocks freed since the last wait stay unused", d->name, rc);
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
bool wait_and_reuse_held(shim_device *d, shim_shard *s)
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
bool wait_and_relock(shim_device *d, shim_shard *s)
{
    shim_lock_release(&s->lock);
    bool ok = wait_for_device(d);
    shim_lock_acquire(&s->lock);
    return ok;
}

/* Keeps a freed block aside until the device has run what was queued
 * before the free. Shard lock held. False when out of host memory for the
 * list (the caller then waits for the device right away). */
bool hold_for_device(shim_shard *s, uint32_t node, size_t block)
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

bool too_much_held(const shim_shard *s)
{
    shim_lock_assert_held(&s->lock);
    if (s->nheld >= HELD_MAX_BLOCKS)
        return true;
    shim_arena_counters c;
    shim_arena_get_counters(s->arena, &c);
    return s->held_bytes > c.reserved_bytes / HELD_MAX_FRACTION;
}

/* Waits for the device once and recycles every shard's held blocks
 * freed before the wait. Device lock held on entry and exit (released for
 * the wait). False when nothing was held. */
bool wait_and_reuse_all_held(shim_device *d)
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
