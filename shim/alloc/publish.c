/* The hook resolution lock (publish_mu, device.h): serializes a runtime's
 * hooks publishing its resolved entry points and creating its device, one
 * lock for every runtime. Here, below the hooks, so that the fork policy
 * can take it; its fork handlers also hold forgotten.c's leaf lock.
 *
 * Locks: taken before devices_mu (creating the device); never held across
 * a loader call, a call into the runtime (the runtime's own locks are
 * taken in its fork handlers, which run before this one's prepare: a
 * runtime call under it inverted that order) or with an allocator lock. */
#include <pthread.h>
#include <stdbool.h>

#include "device.h"
#include "forgotten.h"
#include "mutex.h"

static pthread_mutex_t publish_mu = PTHREAD_MUTEX_INITIALIZER;

/* A device created while this thread holds publish_mu asks the runtime
 * nothing until it is released (device.c, shim_device_learn_capacity). */
void shim_device_publish_lock(void)
{
    shim_mutex_lock(&publish_mu);
    shim_device_defer_capacity(true);
}

void shim_device_publish_unlock(void)
{
    shim_device_defer_capacity(false);
    shim_mutex_unlock(&publish_mu);
}

/* Taken, not started afresh: a publisher holds it only while it fills its
 * runtime's entry points and creates the device (calloc, devices_mu, no
 * loader call, no allocator lock), so prepare's wait is short, and the
 * child finds every runtime either published or untouched. */
void shim_device_publish_atfork_prepare(void)
{
    shim_mutex_lock(&publish_mu);
    shim_forgotten_atfork_prepare(); /* a leaf, held for a few stores */
}

void shim_device_publish_atfork_parent(void)
{
    shim_forgotten_atfork_release();
    shim_mutex_unlock(&publish_mu);
}

void shim_device_publish_atfork_child(void)
{
    shim_forgotten_atfork_release();
    shim_mutex_unlock(&publish_mu);
}
