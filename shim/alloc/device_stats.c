/* What a device says of itself: its statistics (summed over its shards,
 * with the process's peak of live bytes), the memory info the program
 * sees (the runtime's view corrected by the shim's regions), and the
 * records of its live blocks (leak reports and snapshots).
 *
 * Locks: each shard's lock in turn (its prefetched frees finished first),
 * then the device lock for the pressure counters. Never holds two shard
 * locks, never calls a hook. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "device_internal.h"

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
    int rc = d->backend.mem_info(d->backend.ctx, &rfree, &rtotal);
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
        /* Passed-through memory charged to the limit (charge.c) is in the
         * pool's shares beyond the regions': not the program's to have. */
        uint64_t pooled = atomic_load_explicit(&d->pool.reserved, memory_order_relaxed);
        uint64_t taken = used + (pooled > reserved ? pooled - reserved : 0);
        uint64_t room = limit > taken ? limit - taken : 0;
        if (avail > room)
            avail = room;
    }
    if (avail > total)
        avail = total;
    *free_out = (size_t)avail;
    *total_out = total;
    return 0;
}

int shim_device_mem_info_current(const shim_runtime *rt, size_t *free_out, size_t *total_out)
{
    shim_device *d;
    int rc = shim_device_for_caller(rt, &d);
    return rc ? rc : shim_device_mem_info(d, free_out, total_out);
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
    uint64_t seq = shim_live_seq(f);
    if (seq <= c->since || c->n == c->cap)
        return;
    c->out[c->n++] = (shim_record){
        .ptr = ptr,
        .size = shim_arena_block_requested(c->arena, id),
        .seq = seq,
        .node = id,
        .native_stack = shim_arena_tag(c->arena, id, 0),
        .python_stack = shim_arena_tag(c->arena, id, 1),
        .thread = shim_live_thread(f),
    };
}

/* The node of the entry a few slots on starts loading (its size and
 * stack ids are read there). */
static void live_ahead(uint32_t id, void *user)
{
    const struct live_ctx *c = user;
    shim_arena_prefetch(c->arena, id);
}

/* Grows the copy to hold `want` records with no lock held, its pages
 * touched, so that the copy under the lock is stores only (at 100,000
 * live blocks the page faults of a fresh 4 MB buffer were a third of the
 * time the lock was held). */
static bool grow_outside(struct live_ctx *c, size_t want)
{
    size_t cap = want + want / 8 + 64;
    shim_record *o = realloc(c->out, cap * sizeof *o);
    if (!o)
        return false;
    memset(o + c->cap, 0, (cap - c->cap) * sizeof *o);
    c->out = o;
    c->cap = cap;
    return true;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

shim_record *shim_device_live_timed(shim_device *d, uint64_t since, size_t *n,
                                    shim_live_timing *t)
{
    *n = 0;
    struct live_ctx c = {.since = since};
    unsigned ns = shard_count(d);
    for (unsigned k = 0; k < ns; k++) {
        shim_shard *s = d->shards[k];
        for (;;) {
            uint64_t t0 = t ? shim_now_ns() : 0, c0 = t ? thread_cpu_ns() : 0;
            bool taken = lock_with_frees_finished(d, s);
            size_t count = shim_table_count(s->table);
            bool fits = c.n + count <= c.cap;
            if (fits) {
                c.arena = s->arena;
                shim_table_foreach_ahead(s->table, collect_live, live_ahead, &c);
            }
            if (taken)
                shim_lock_release(&s->lock);
            if (t) {
                uint64_t dt = shim_now_ns() - t0, dc = thread_cpu_ns() - c0;
                t->held_ns += dt;
                t->held_cpu_ns += dc;
                if (dt > t->longest_ns)
                    t->longest_ns = dt;
                if (dc > t->longest_cpu_ns)
                    t->longest_cpu_ns = dc;
            }
            if (fits)
                break;
            /* Sized outside the lock, then taken again (the table may have
             * grown meanwhile: then once more). A thread that holds this
             * lock already grows it under the lock, where it cannot grow. */
            if (!grow_outside(&c, c.n + count)) {
                free(c.out);
                return NULL;
            }
        }
    }
    if (!c.out)
        c.out = malloc(sizeof *c.out);
    *n = c.n;
    return c.out;
}

shim_record *shim_device_live(shim_device *d, uint64_t since, size_t *n)
{
    return shim_device_live_timed(d, since, n, NULL);
}

struct seq_ctx {
    uint64_t *out;
    size_t n, cap;
};

static void collect_seq(uintptr_t ptr, uint32_t id, const shim_live_fields *f, void *user)
{
    (void)ptr;
    (void)id;
    struct seq_ctx *c = user;
    if (c->n < c->cap)
        c->out[c->n++] = shim_live_seq(f);
}

static void seq_ahead(uint32_t id, void *user)
{
    (void)id;
    (void)user;   /* the fields' line, which the walk prefetches, is all it reads */
}

int shim_device_live_seqs(shim_device *d, uint64_t **seqs, size_t *n, size_t *cap)
{
    struct seq_ctx c = {.out = *seqs, .n = *n, .cap = *cap};
    int rc = 0;
    unsigned ns = shard_count(d);
    for (unsigned k = 0; k < ns && rc == 0; k++) {
        shim_shard *s = d->shards[k];
        for (;;) {
            bool taken = lock_with_frees_finished(d, s);
            size_t count = shim_table_count(s->table);
            bool fits = c.n + count <= c.cap;
            if (fits)
                shim_table_foreach_ahead(s->table, collect_seq, seq_ahead, &c);
            if (taken)
                shim_lock_release(&s->lock);
            if (fits)
                break;
            /* Grown with no lock held, as shim_device_live's copy. */
            size_t want = c.n + count, ncap = want + want / 8 + 64;
            uint64_t *o = realloc(c.out, ncap * sizeof *o);
            if (!o) {
                rc = -1;
                break;
            }
            c.out = o;
            c.cap = ncap;
        }
    }
    *seqs = c.out;
    *n = c.n;
    *cap = c.cap;
    return rc;
}

void shim_device_reset_peak(shim_device *d)
{
    unsigned ns = shard_count(d);
    for (unsigned k = 0; k < ns; k++) {
        shim_shard *s = d->shards[k];
        bool taken = lock_with_frees_finished(d, s);
        s->peak_live_bytes = s->live_bytes;
        if (taken)
            shim_lock_release(&s->lock);
    }
    int64_t live = atomic_load_explicit(&d->live_total, memory_order_relaxed);
    atomic_store_explicit(&d->peak_total, live > 0 ? (uint64_t)live : 0, memory_order_relaxed);
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
