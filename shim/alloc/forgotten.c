/* Regions forgotten at their context's teardown (the runtime freed them):
 * a later free of an address inside one is answered as the runtime
 * answers a dead pointer, never passed to it as if live (it may have given
 * the address to someone else). The last FORGOTTEN_MAX, dropped when the
 * shim reserves a region over one. Guarded by forgotten_mu, a leaf.
 *
 * Owns the ring and forgotten_mu, a leaf (taken under arena locks when a
 * region is reserved or forgotten, and by the fork policy). Never takes
 * another lock, never calls the runtime. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "forgotten.h"
#include "mutex.h"

#define FORGOTTEN_MAX 256
static pthread_mutex_t forgotten_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t start, end;
} forgotten[FORGOTTEN_MAX];
static size_t forgotten_next;
static _Atomic bool any_forgotten;

void shim_forgotten_reserved(uintptr_t addr, size_t size)
{
    if (!atomic_load_explicit(&any_forgotten, memory_order_relaxed))
        return;
    shim_mutex_lock(&forgotten_mu);
    for (size_t i = 0; i < FORGOTTEN_MAX; i++)
        if (forgotten[i].start < addr + size && addr < forgotten[i].end)
            forgotten[i].start = forgotten[i].end = 0;
    shim_mutex_unlock(&forgotten_mu);
}

void shim_forgotten_add(uintptr_t addr, size_t size)
{
    shim_mutex_lock(&forgotten_mu);
    forgotten[forgotten_next].start = addr;
    forgotten[forgotten_next].end = addr + size;
    forgotten_next = (forgotten_next + 1) % FORGOTTEN_MAX;
    atomic_store_explicit(&any_forgotten, true, memory_order_relaxed);
    shim_mutex_unlock(&forgotten_mu);
}

bool shim_forgotten_contains(uintptr_t addr)
{
    if (!atomic_load_explicit(&any_forgotten, memory_order_relaxed))
        return false;
    bool in = false;
    shim_mutex_lock(&forgotten_mu);
    for (size_t i = 0; i < FORGOTTEN_MAX && !in; i++)
        in = addr >= forgotten[i].start && addr < forgotten[i].end;
    shim_mutex_unlock(&forgotten_mu);
    return in;
}

void shim_forgotten_atfork_prepare(void)
{
    shim_mutex_lock(&forgotten_mu); /* a leaf, held for a few stores */
}

void shim_forgotten_atfork_release(void)
{
    shim_mutex_unlock(&forgotten_mu);
}
