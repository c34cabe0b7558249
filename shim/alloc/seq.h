/* Allocation sequence numbers (seq.c's concept), inlined into every
 * allocation, served (alloc_path.c) or watched (passthrough.c). Internal
 * to shim/alloc. */
#ifndef SHIM_ALLOC_SEQ_H
#define SHIM_ALLOC_SEQ_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "mutex.h"

/* seq.c: a trace is taken (the device's event hook is set: registry.c):
 * numbers go one by one, from the counter. */
extern _Atomic bool seq_one_by_one;

/* Allocation sequence numbers. With one thread, every allocation adds one
 * to the counter. With several, a thread takes SEQ_BATCH numbers at a
 * time and hands them out itself: one shared counter added to by every
 * allocation of two threads took half of an allocation's time (its line
 * going from core to core). A mark (shim_device_seq_now) reads the counter
 * and then advances the epoch, which ends every thread's batch: whatever a
 * thread allocates after the mark (happens-after it) takes a new batch,
 * above the mark. While a trace is taken, numbers come from the counter
 * one by one: the trace orders events by them. Counter and epoch each on
 * a line of its own (the epoch is read by every allocation and written by
 * marks only). */
#define SEQ_BATCH 64
/* seq.c: each on a cache line of its own. */
extern _Atomic uint64_t seq_counter;
extern _Atomic uint64_t seq_epoch;
struct shim_seq_batch {
    uint64_t next, end, epoch;
};
extern __thread __attribute__((tls_model("initial-exec"))) struct shim_seq_batch tls_seq;

/* A new batch of sequence numbers for the calling thread; returns its
 * first. */
__attribute__((noinline, unused)) static uint64_t seq_refill(uint64_t epoch)
{
    uint64_t base = atomic_fetch_add_explicit(&seq_counter, SEQ_BATCH, memory_order_relaxed);
    tls_seq.epoch = epoch;
    tls_seq.next = base + 2;
    tls_seq.end = base + SEQ_BATCH + 1;
    return base + 1;
}

/* A number without a call, where one can be had so (one thread, or the
 * thread's batch not spent), for a caller that knows no trace is taken
 * (passthrough.c's common add, which looks at its own trace hook first):
 * true, in *out. */
static inline bool seq_try_untraced(uint64_t *out)
{
    /* One thread: no other can take a number between the load and the
     * store, and a lock-prefixed add would be a full barrier per call. */
    if (shim_single_threaded()) {
        uint64_t v = atomic_load_explicit(&seq_counter, memory_order_relaxed) + 1;
        atomic_store_explicit(&seq_counter, v, memory_order_relaxed);
        *out = v;
        return true;
    }
    /* Acquire: a batch taken after a mark's epoch is taken after the
     * mark's read of the counter, so its numbers are above the mark. */
    uint64_t e = atomic_load_explicit(&seq_epoch, memory_order_acquire);
    if (tls_seq.next < tls_seq.end && tls_seq.epoch == e) {
        *out = tls_seq.next++;
        return true;
    }
    return false;
}

/* The same for any caller: with several threads, none from a batch while
 * a trace is taken (the trace orders events by their numbers). */
static inline bool seq_try_take(uint64_t *out)
{
    if (!shim_single_threaded() && atomic_load_explicit(&seq_one_by_one, memory_order_relaxed))
        return false;
    return seq_try_untraced(out);
}

/* Inline: every allocation takes one. */
static inline uint64_t seq_take(void)
{
    uint64_t v;
    if (seq_try_take(&v))
        return v;
    if (atomic_load_explicit(&seq_one_by_one, memory_order_relaxed)) {
        tls_seq.end = 0; /* a batch from before would go back in time */
        return atomic_fetch_add_explicit(&seq_counter, 1, memory_order_relaxed) + 1;
    }
    return seq_refill(atomic_load_explicit(&seq_epoch, memory_order_acquire));
}

#endif
