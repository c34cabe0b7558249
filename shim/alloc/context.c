/* A context's teardown: the runtime frees every allocation of a context
 * that goes (destroyed, reset), so the shim forgets the context's blocks,
 * held blocks and regions (into forgotten.c's ring, through the backend),
 * releasing nothing and waiting for nothing, and the device is left vacant
 * for the next context of its ordinal.
 *
 * Locks: takes the device lock, then every shard's in index order, then
 * devices_mu to make the device vacant (docs/locking.md); the trace's
 * events are told after every lock is released. Never called with an
 * allocator lock of the caller's own other than a pressure callback's. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>

#include "device_internal.h"
#include "forgotten.h"
#include "passthrough.h"
#include "log.h"
#include "options.h"

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
            .seq = shim_live_seq(f),
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
void shim_context_forget(shim_device *d)
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
            atomic_load_explicit(&d->context, memory_order_acquire) == context) {
            shim_context_forget(d);
            /* The context's managed memory goes with it (the driver frees
             * it): records and charges, not leaks at exit. */
            shim_passthrough_drop_pool(SHIM_PT_MANAGED, &d->pool);
        }
    }
}

/* The runtime frees a torn-down context's regions and may give their
 * addresses out again by routes the shim does not serve (a stream-ordered
 * pool's allocation, say): such an address is the runtime's live memory,
 * and the runtime's answer outranks the ring. No allocator lock held (the
 * runtime is asked). */
bool shim_forgotten_dead(const shim_runtime *rt, uintptr_t addr)
{
    if (!shim_forgotten_contains(addr))
        return false;
    if (!rt->holds)
        return true;
    tls_in_backend++;
    bool live = rt->holds(addr);
    tls_in_backend--;
    return !live;
}
