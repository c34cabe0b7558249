/* The registry: the devices made so far (devices[0 .. ndevices), published
 * with a release store) and the hooks the layers above register on the
 * allocator (leak hunting's capture and out-of-memory, the trace's
 * events; the allocator never calls up otherwise). What the device's
 * files read, defined below them all: device.c makes devices and adds
 * them here, the shards, the sequence numbers and the paths read the list
 * and the hooks (device_internal.h declares them).
 *
 * Locks: devices_mu guards the creation of devices and which context a
 * device serves (docs/locking.md); taken by device.c and context.c, never
 * here. The list is read without it, the hooks are atomics set at init. */
#include <pthread.h>
#include <stdatomic.h>

#include "device_internal.h"

_Atomic(shim_capture_fn) capture_hook;
_Atomic(shim_oom_fn) oom_hook;
_Atomic(shim_event_fn) event_hook;

pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
shim_device *devices[SHIM_MAX_DEVICES];
_Atomic size_t ndevices;

void shim_device_set_leak_hooks(shim_capture_fn capture, shim_oom_fn on_oom)
{
    atomic_store(&oom_hook, on_oom);
    atomic_store(&capture_hook, capture);
}

void shim_device_set_event_hook(shim_event_fn fn)
{
    atomic_store(&seq_one_by_one, fn != NULL); /* first: no batch number for an event */
    atomic_store(&event_hook, fn);
}

size_t shim_device_count(void)
{
    return atomic_load_explicit(&ndevices, memory_order_acquire);
}

shim_device *shim_device_at(size_t i)
{
    return i < shim_device_count() ? devices[i] : NULL;
}
