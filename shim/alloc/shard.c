/* Shards and thread homing: a device's arenas, one per group of threads
 * (SPYRESHIM_ARENAS), each with its live table and lock, made when a
 * thread finds its shard's lock held, and the calling thread's shard of
 * each device (moved once, counted while it runs).
 *
 * Locks: a new shard is made and published under the device lock (fork's
 * prepare counts the shards under it); a shard's own lock guards it
 * (device_internal.h). Never takes a shard lock while holding another, and
 * never the device lock while holding a shard's. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "device_internal.h"
#include "hostmem.h"
#include "log.h"
#include "options.h"

__thread __attribute__((tls_model("initial-exec"))) unsigned char tls_shard[SHIM_MAX_DEVICES];
__thread __attribute__((tls_model("initial-exec"))) unsigned char tls_moved[SHIM_MAX_DEVICES];

unsigned shim_shard_default_count(void)
{
    unsigned n = shim_opts()->arenas;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = cpus > 0 ? (unsigned)cpus : 1;
    }
    return n > SHIM_MAX_SHARDS ? SHIM_MAX_SHARDS : n;
}

shim_shard *shim_shard_create(shim_device *d)
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
            shim_shard *s = shim_shard_create(d);
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

/* Locks the calling thread's shard; *taken as lock_unless_mine. Called by the
 * general allocation path (the fast one only tries the lock). */
shim_shard *shim_shard_lock_home(shim_device *d, bool *taken)
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
