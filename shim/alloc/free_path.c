/* The free path: the fast path (a block of the thread's own shard, free
 * to lock, no trace, no device to wait for: out of the table, its node's
 * line prefetched and its arena work left for a later free,
 * free_after_prefetch) and the general one (the other shards, the other
 * devices of the runtime, forgotten regions, foreign and invalid
 * pointers, blocks held for the device, held.c). Its instruction count is
 * measured with the allocation's (docs/allocator.md, "Files").
 *
 * Locks: one shard lock at a time; dropped for a wait for the device only
 * when this call took it. Never tells the trace or warns with an
 * allocator lock held, and never passes a pointer of a shim region, live
 * or forgotten, to the runtime's real free. */
#include <stdatomic.h>
#include <stdint.h>

#include "device_internal.h"
#include "forgotten.h"
#include "log.h"

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
        /* The allocating thread's slot, once some thread is counted
         * (thread_live.h); until then the fields are not read. */
        shim_live_fields f = {0};
        bool counted = atomic_load_explicit(&shim_thread_live_on, memory_order_relaxed);
        uint32_t node = shim_table_remove(s->table, (uintptr_t)ptr, counted ? &f : NULL);
        shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
        if (node != SHIM_TABLE_NONE && !ev && !d->rt->sync_device &&
            !shim_live_thread(&f)) {
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
            if (shim_live_thread(&f))
                shim_thread_live_freed(shim_live_thread(&f), size);
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
    if (!atomic_load_explicit(&event_hook, memory_order_relaxed) && !d->rt->sync_device &&
        !atomic_load_explicit(&shim_thread_live_on, memory_order_relaxed)) {
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
    if (shim_forgotten_dead(rt, (uintptr_t)ptr)) {
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
