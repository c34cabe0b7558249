/* Making room for a request that no shard could serve, one step at a time
 * (the allocation path, alloc_path.c, loops over them): the blocks held
 * for the device (one wait frees them), the cached empty regions (trimmed
 * back to the runtime), then a pressure event (pressure.c), within the
 * request's budget (SPYRESHIM_PRESSURE_ROUNDS).
 *
 * Locks: called with the device lock held; a pressure event and the wait
 * for the device release and take it again; shard locks are taken one at a
 * time under it. Never starts pressure work for an allocation that
 * pressure work itself makes. */
#include <stdbool.h>
#include <stddef.h>

#include "device_internal.h"

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
bool shim_device_make_room(shim_device *d, size_t size, struct relief_budget *b)
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
