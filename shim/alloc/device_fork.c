/* fork(): what a device does; when, and in which order with every other
 * lock of the process, is shim/process/fork.c's (docs/locking.md).
 *
 * Owns the ready hook (a device's fork handlers are installed once its
 * runtime's first call returned) and each device's fork state
 * (fork_locked, fork_nshards). prepare takes the device lock, then every
 * shard lock in index order; parent and child release them; the child
 * resets the pressure event. Never takes a lock in the child other than
 * starting one afresh. */
#include <pthread.h>
#include <stdatomic.h>

#include "device_internal.h"

static _Atomic(shim_device_ready_fn) ready_hook;

/* Device i as the fork handlers see it: the acquire load of the count pairs
 * with the release store that published the device (the handlers were
 * installed by another thread, through glibc's own lock). */
static shim_device *device_slot(size_t i)
{
    return i < atomic_load_explicit(&ndevices, memory_order_acquire) ? devices[i] : NULL;
}

/* The device lock, then every shard's, in index order (docs/locking.md). */
void shim_device_fork_prepare(size_t i)
{
    shim_device *d = device_slot(i);
    if (!d)
        return;
    shim_lock_acquire(&d->lock);
    unsigned n = shard_count(d);
    for (unsigned k = 0; k < n; k++)
        shim_lock_acquire(&d->shards[k]->lock);
    d->fork_nshards = n;
    d->fork_locked = true;
}

static void fork_unlock(shim_device *d)
{
    d->fork_locked = false;
    for (unsigned k = d->fork_nshards; k-- > 0;)
        shim_lock_release(&d->shards[k]->lock);
    shim_lock_release(&d->lock);
}

void shim_device_fork_parent(size_t i)
{
    shim_device *d = device_slot(i);
    if (!d || !d->fork_locked)
        return;
    fork_unlock(d);
}

static void reset_pressure(shim_device *d)
{
    shim_pressure_state_atfork_child(&d->ps);
}

void shim_device_fork_child(size_t i)
{
    shim_device *d = device_slot(i);
    if (!d || !d->fork_locked)
        return;
    reset_pressure(d);
    fork_unlock(d);
}

void shim_device_announce_ready(shim_device *d)
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
    /* The forking thread's batch may hold numbers the child, one thread
     * again, hands out from the counter. */
    atomic_fetch_add_explicit(&seq_epoch, 1, memory_order_relaxed);
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (!d->fork_locked) {
            shim_lock_init(&d->lock);
            for (unsigned k = 0; k < shard_count(d); k++)
                shim_lock_init_fast(&d->shards[k]->lock);
            reset_pressure(d);
        }
    }
}
