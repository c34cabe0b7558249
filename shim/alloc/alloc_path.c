/* The allocation path: the fast path (the common request: no stacks, no
 * trace, fork handlers in place, the thread's shard free to lock) and the
 * general one (stacks captured before any lock, the shard the thread is
 * homed on, the other shards, then room made under the device lock,
 * room.c), each try a `serve` of one shard; and the final out-of-memory.
 * Its instruction count is measured (docs/allocator.md, "Files"): what it
 * calls on the common path is static (here, or in device_internal.h).
 *
 * Locks: a try holds one shard lock; the slow path takes the device lock,
 * then shard locks one at a time. Never captures stacks, calls the hooks
 * (event, out-of-memory) or announces a device with an allocator lock held
 * (a pressure callback's own excepted). */
#include <stdatomic.h>
#include <stdint.h>

#include "device_internal.h"
#include "log.h"
#include "options.h"

/* Step: one try at serving the request from shard `s`, recording the
 * block (and counting it to the calling thread's slot `thread`, nonzero
 * where it asked to be counted: thread_live.h). Shard lock held. False when no block fits (or the table could not
 * grow: out of host memory, reported as out-of-memory too); *rt_err is
 * then the runtime's own error when it refused a region for a reason other
 * than out-of-memory (0 otherwise). *seq is the allocation's sequence
 * number. */
static inline __attribute__((always_inline)) bool
serve(shim_device *d, shim_shard *s, size_t size, bool may_grow, bool own, uint32_t nstack,
      uint32_t pystack, uint16_t thread, uintptr_t *out, uint64_t *seq, int *rt_err)
{
    shim_lock_assert_held(&s->lock);
    uintptr_t addr;
    uint32_t node;
    size_t block;
    int rc = own ? shim_arena_alloc_own(s->arena, size, may_grow, &addr, &node, &block)
                 : shim_arena_alloc_fit(s->arena, size, &addr, &node, &block);
    if (rc != 0 && !own) {
        /* A block the last frees left for later may be what fits, and
         * must be, before a new region is reserved. */
        finish_prefetched_frees(d, s);
        rc = may_grow ? shim_arena_alloc(s->arena, size, &addr, &node, &block)
                      : shim_arena_alloc_fit(s->arena, size, &addr, &node, &block);
    }
    *rt_err = rc > 0 ? rc : 0;
    if (rc != 0)
        return false;
    uint64_t n = seq_take();
    shim_live_fields f = shim_live_make(n, thread);
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
    if (__builtin_expect(thread != 0, 0))
        shim_thread_live_count(thread, size);
    *out = addr;
    *seq = n;
    return true;
}

/* Step: serve from the shards, the caller's first (unless `skip_home`),
 * each under its own lock (the device lock may be held: it comes first in
 * the order). `steal`: from the free blocks of shards not busy now, the
 * caller's excepted, reserving nothing (room in a busy shard is not worth
 * a wait: the caller moved away from it for that); otherwise growing. */
static bool serve_any(shim_device *d, size_t size, bool steal, bool skip_home, bool own,
                      uint32_t nstack, uint32_t pystack, uint16_t thread, uintptr_t *out,
                      uint64_t *seq, int *rt_err)
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
        bool ok = serve(d, s, size, !steal, own, nstack, pystack, thread, out, seq, rt_err);
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
    /* Watched memory charged to the limit (charge.c) holds shares of the
     * pool too: the limit is reached by both. */
    uint64_t pooled = atomic_load_explicit(&d->pool.reserved, memory_order_relaxed);
    if (pooled > facts.reserved)
        facts.reserved = pooled;
    size_t dfree = 0, dtotal = 0;
    facts.device_known = d->rt->real_mem_info &&
                         d->backend.mem_info(d->backend.ctx, &dfree, &dtotal) == 0;
    facts.device_free = facts.device_known ? dfree : 0;
    facts.device_total = facts.device_known ? dtotal : 0;
    facts.collecting = shim_pressure_failed_during_collection(&facts.collecting_ns);
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
static int malloc_slow(shim_device *d, size_t size, bool home_grew, bool own, uint32_t nstack,
                       uint32_t pystack, uint16_t thread, uintptr_t *addr, uint64_t *seq)
{
    int rt_err;
    /* Free blocks of the other shards not busy now before a new region
     * for this one: threads that moved leave space behind in the shard
     * they left. Then every shard, growing; the caller's only if its try
     * did not (the runtime has just refused it). */
    if (serve_any(d, size, true, true, own, nstack, pystack, thread, addr, seq, &rt_err))
        return 0;
    if (serve_any(d, size, false, home_grew, own, nstack, pystack, thread, addr, seq, &rt_err))
        return 0;
    if (rt_err)
        return fail_other(d, size, rt_err);
    /* Already holding the device lock means a pressure callback allocates
     * before releasing it: serve it if memory is there, never start
     * pressure work. */
    bool taken = lock_unless_mine(&d->lock);
    struct relief_budget budget = {.max_rounds = shim_opts()->pressure_rounds};
    for (;;) {
        if (!taken || !shim_device_make_room(d, size, &budget))
            return fail(d, size, taken);
        if (serve_any(d, size, false, false, own, nstack, pystack, thread, addr, seq, &rt_err))
            break;
        if (rt_err) {
            shim_lock_release(&d->lock);
            return fail_other(d, size, rt_err);
        }
    }
    shim_lock_release(&d->lock);
    return 0;
}

static int malloc_general(shim_device *d, void **ptr, size_t size, bool own);

int shim_device_malloc(shim_device *d, void **ptr, size_t size)
{
    /* The common request, apart so that it carries only what it uses: no
     * stacks to capture, no trace, fork handlers in place, a thread not
     * counted (thread_live.h), and the thread's arena free. Anything else,
     * and a failed try, take the general path. */
    if (ptr && size - 1 < (SIZE_MAX >> 1) && !shim_tls_thread_slot &&
        !atomic_load_explicit(&capture_hook, memory_order_relaxed) &&
        !atomic_load_explicit(&event_hook, memory_order_relaxed) &&
        atomic_load_explicit(&d->fork_registered, memory_order_relaxed)) {
        shim_shard *s = d->shards[home_index(d)];
        if (!shim_lock_held_by_me(&s->lock) && shim_lock_try(&s->lock)) {
            uintptr_t addr;
            uint64_t seq;
            int rt_err;
            bool grow = shard_count(d) == 1;
            bool ok = serve(d, s, size, grow, false, 0, 0, 0, &addr, &seq, &rt_err);
            shim_lock_release(&s->lock);
            if (!ok) {
                if (rt_err)
                    return fail_other(d, size, rt_err);
                int rc = malloc_slow(d, size, grow, false, 0, 0, 0, &addr, &seq);
                if (rc != 0)
                    return rc;
            }
            *ptr = (void *)addr;
            return 0;
        }
    }
    return malloc_general(d, ptr, size, false);
}

int shim_device_malloc_own(shim_device *d, void **ptr, size_t size)
{
    return malloc_general(d, ptr, size, true);
}

__attribute__((noinline)) static int malloc_general(shim_device *d, void **ptr, size_t size,
                                                    bool own)
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

    uint16_t thread = shim_tls_thread_slot;
    bool taken;
    shim_shard *s = shim_shard_lock_home(d, &taken);
    uintptr_t addr;
    uint64_t seq;
    int rt_err;
    /* With one shard, as ever; with several, this shard's free blocks
     * first, then the others' (malloc_slow), then a new region. */
    bool grow = shard_count(d) == 1;
    bool ok = serve(d, s, size, grow, own, nstack, pystack, thread, &addr, &seq, &rt_err);
    if (taken)
        shim_lock_release(&s->lock);
    if (!ok) {
        if (rt_err)
            return fail_other(d, size, rt_err);
        int rc = malloc_slow(d, size, grow, own, nstack, pystack, thread, &addr, &seq);
        if (rc != 0)
            return rc;
    }
    shim_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(SHIM_EVENT_ALLOC, d->index, seq, addr, size, nstack, pystack);
    if (!atomic_load_explicit(&d->fork_registered, memory_order_relaxed) &&
        !shim_lock_held_by_me(&d->lock))
        shim_device_announce_ready(d);
    *ptr = (void *)addr;
    return 0;
}

int shim_device_malloc_current(const shim_runtime *rt, void **ptr, size_t size)
{
    shim_device *d;
    int rc = shim_device_for_caller(rt, &d);
    return rc ? rc : shim_device_malloc(d, ptr, size);
}
