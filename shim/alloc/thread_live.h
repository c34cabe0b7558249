/* Per-thread live bytes: device bytes a thread allocated that are still
 * live, whoever frees them, and their peak since the thread's last reset
 * (spyreshim_thread_reset_peak; the pytest plugin's
 * limit_memory(current_thread_only=True)). Only threads that asked are
 * counted: such a thread has a slot (1 .. SHIM_THREAD_SLOTS - 1, kept in
 * its live blocks' table fields, shim_live_fields.thread), every other
 * thread has slot 0 and its allocations cost one thread-local load.
 *
 * Locks: none. A slot's live bytes are an atomic (the owner adds, any
 * thread's free subtracts); its peak is the owner's alone. Frees read a
 * block's slot only once some thread asked (shim_thread_live_on), so that
 * until then the free paths read no more than before. Never blocks, never
 * allocates on the allocation or free path (thread_live.c claims slots in
 * the API call, with no lock of ours held). */
#ifndef SHIM_THREAD_LIVE_H
#define SHIM_THREAD_LIVE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* 16 bits in a live block's fields (table.h). */
#define SHIM_THREAD_SLOTS 65536u
#define SHIM_THREAD_CHUNK 64u

typedef struct shim_thread_live {
    _Atomic int64_t live;     /* bytes of live blocks the owner allocated */
    uint64_t peak;            /* the owner's: most of `live` since its reset */
    _Atomic unsigned state;   /* thread_live.c: free, owned, orphaned */
} __attribute__((aligned(64))) shim_thread_live;

/* True once any thread asked to be counted (never false again). */
extern atomic_bool shim_thread_live_on;
/* The calling thread's slot, 0: not counted. */
extern __thread __attribute__((tls_model("initial-exec"))) uint16_t shim_tls_thread_slot;
/* Chunks of SHIM_THREAD_CHUNK slots, made on demand (published once). */
extern _Atomic(shim_thread_live *) shim_thread_chunks[SHIM_THREAD_SLOTS / SHIM_THREAD_CHUNK];

static inline shim_thread_live *shim_thread_live_at(uint16_t slot)
{
    shim_thread_live *c = atomic_load_explicit(&shim_thread_chunks[slot / SHIM_THREAD_CHUNK],
                                               memory_order_acquire);
    return &c[slot % SHIM_THREAD_CHUNK];
}

/* A block of `size` bytes was allocated by the thread of `slot`
 * (nonzero): the calling thread. */
static inline void shim_thread_live_count(uint16_t slot, uint64_t size)
{
    shim_thread_live *t = shim_thread_live_at(slot);
    int64_t now = atomic_fetch_add_explicit(&t->live, (int64_t)size, memory_order_relaxed) +
                  (int64_t)size;
    if (now > 0 && (uint64_t)now > t->peak)
        t->peak = (uint64_t)now;
}

/* A block of slot `slot` (nonzero) of `size` bytes was freed, by any
 * thread. Out of line: it may give an orphaned slot back. */
void shim_thread_live_freed(uint16_t slot, uint64_t size);

#pragma GCC visibility pop

#endif
