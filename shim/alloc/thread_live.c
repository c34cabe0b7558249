/* Per-thread live bytes (thread_live.h): the slots, their claim by a thread
 * that asks to be counted, their return when it exits, and the public API
 * (spyreshim_thread_reset_peak, spyreshim_thread_used,
 * spyreshim_thread_peak).
 *
 * Locks: none; slots change hands with compare-and-swap on their state.
 * Called with no lock of ours held (the API) or under a shard lock
 * (shim_thread_live_freed, which only does atomics). Never blocks. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "hostmem.h"
#include "spyreshim.h"
#include "thread_live.h"

/* A slot's state: FREE (nobody's; live is 0), OWNED (a running thread's),
 * ORPHAN (its thread exited while blocks it allocated were live: given
 * back by the free that takes live to 0). */
enum { SLOT_FREE = 0, SLOT_OWNED, SLOT_ORPHAN };

atomic_bool shim_thread_live_on;
__thread __attribute__((tls_model("initial-exec"))) uint16_t shim_tls_thread_slot;
_Atomic(shim_thread_live *) shim_thread_chunks[SHIM_THREAD_SLOTS / SHIM_THREAD_CHUNK];
static _Atomic unsigned next_fresh = 1;    /* slot 0 is "not counted" */

static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static bool exit_key_ok;

static bool chunk_ready(unsigned slot)
{
    _Atomic(shim_thread_live *) *c = &shim_thread_chunks[slot / SHIM_THREAD_CHUNK];
    if (atomic_load_explicit(c, memory_order_acquire))
        return true;
    shim_thread_live *fresh = shim_hostmem_lines(SHIM_THREAD_CHUNK * sizeof *fresh);
    if (!fresh)
        return false;
    shim_thread_live *none = NULL;
    if (!atomic_compare_exchange_strong_explicit(c, &none, fresh, memory_order_acq_rel,
                                                 memory_order_acquire))
        free(fresh); /* another thread published one first */
    return true;
}

static bool take(unsigned slot)
{
    unsigned expect = SLOT_FREE;
    return atomic_compare_exchange_strong_explicit(&shim_thread_live_at((uint16_t)slot)->state,
                                                   &expect, SLOT_OWNED, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

/* A slot for the calling thread: a fresh one, else one given back; 0 when
 * all are taken (or no host memory). */
static uint16_t claim(void)
{
    unsigned id = atomic_load_explicit(&next_fresh, memory_order_relaxed);
    while (id < SHIM_THREAD_SLOTS) {
        if (!atomic_compare_exchange_weak_explicit(&next_fresh, &id, id + 1,
                                                   memory_order_relaxed, memory_order_relaxed))
            continue;
        if (!chunk_ready(id))
            return 0;
        if (take(id))
            return (uint16_t)id;
        id = atomic_load_explicit(&next_fresh, memory_order_relaxed);
    }
    for (id = 1; id < SHIM_THREAD_SLOTS; id++)
        if (atomic_load_explicit(&shim_thread_chunks[id / SHIM_THREAD_CHUNK],
                                 memory_order_acquire) && take(id))
            return (uint16_t)id;
    return 0;
}

/* Gives `t` back if it is an orphan with nothing live. Both the exiting
 * owner (after marking it ORPHAN) and a free (after taking live to 0)
 * call it: sequentially consistent, so at least one of them sees the
 * other's write, and the exchange lets one of them give it back. */
static void give_back_if_empty(shim_thread_live *t)
{
    if (atomic_load_explicit(&t->live, memory_order_seq_cst) != 0)
        return;
    unsigned expect = SLOT_ORPHAN;
    atomic_compare_exchange_strong_explicit(&t->state, &expect, SLOT_FREE, memory_order_seq_cst,
                                            memory_order_relaxed);
}

static void thread_exit(void *unused)
{
    (void)unused;
    uint16_t slot = shim_tls_thread_slot;
    if (!slot)
        return;
    shim_tls_thread_slot = 0;
    shim_thread_live *t = shim_thread_live_at(slot);
    atomic_store_explicit(&t->state, SLOT_ORPHAN, memory_order_seq_cst);
    give_back_if_empty(t);
}

static void make_exit_key(void)
{
    exit_key_ok = pthread_key_create(&exit_key, thread_exit) == 0;
}

void shim_thread_live_freed(uint16_t slot, uint64_t size)
{
    shim_thread_live *t = shim_thread_live_at(slot);
    if (atomic_fetch_sub_explicit(&t->live, (int64_t)size, memory_order_seq_cst) ==
            (int64_t)size &&
        atomic_load_explicit(&t->state, memory_order_seq_cst) == SLOT_ORPHAN)
        give_back_if_empty(t);
}

SPYRESHIM_API int spyreshim_thread_reset_peak(void)
{
    uint16_t slot = shim_tls_thread_slot;
    if (!slot) {
        /* The key first: a slot is only claimed where its return at the
         * thread's exit is arranged. */
        pthread_once(&exit_once, make_exit_key);
        if (!exit_key_ok || pthread_setspecific(exit_key, (void *)1) != 0)
            return -1;
        slot = claim();
        if (!slot)
            return -1;
        shim_thread_live *t = shim_thread_live_at(slot);
        t->peak = 0;
        shim_tls_thread_slot = slot;
        /* Frees read blocks' slots from now on. Release: a free that sees
         * it also sees the slot's state. */
        atomic_store_explicit(&shim_thread_live_on, true, memory_order_release);
        return 0;
    }
    shim_thread_live *t = shim_thread_live_at(slot);
    int64_t live = atomic_load_explicit(&t->live, memory_order_relaxed);
    t->peak = live > 0 ? (uint64_t)live : 0;
    return 0;
}

SPYRESHIM_API uint64_t spyreshim_thread_used(void)
{
    uint16_t slot = shim_tls_thread_slot;
    if (!slot)
        return 0;
    int64_t live = atomic_load_explicit(&shim_thread_live_at(slot)->live, memory_order_relaxed);
    return live > 0 ? (uint64_t)live : 0;
}

SPYRESHIM_API uint64_t spyreshim_thread_peak(void)
{
    uint16_t slot = shim_tls_thread_slot;
    return slot ? shim_thread_live_at(slot)->peak : 0;
}
