/* The CUDA contexts the program made (cuCtxCreate in every form) or
 * retained (primary contexts): the driver has no call that lists a
 * device's contexts, and a freed block must not be handed out again
 * before the work queued in every context of its device has run, in a
 * context the shim served allocations in or not (shim/alloc/held.c asks
 * the runtime's contexts_of). Only handles and their device: whether a
 * context still exists is the driver's answer at each wait (a push that
 * fails: gone, and dropped here); a handle the driver gives out again is
 * registered again with its new device.
 *
 * Owns a fixed table of slots, lock-free (a context may be made in a
 * child after fork, or by a thread a signal interrupted): a slot is
 * claimed by a compare-and-swap from empty, its device written, then its
 * handle published; cleared by a compare-and-swap. Never calls the
 * driver, never takes a lock. */
#include <stdatomic.h>
#include <stdint.h>

#include "cuda.h"
#include "log.h"

#define SLOTS 256
#define EMPTY ((uintptr_t)0)
#define CLAIMED ((uintptr_t)1) /* being filled: readers skip it */

static struct {
    _Atomic uintptr_t ctx;
    _Atomic int ordinal;
} slots[SLOTS];

void shim_cuda_context_created(CUcontext ctx, int ordinal)
{
    uintptr_t c = (uintptr_t)ctx;
    if (c <= CLAIMED)
        return;
    for (size_t i = 0; i < SLOTS; i++)
        if (atomic_load_explicit(&slots[i].ctx, memory_order_acquire) == c) {
            atomic_store_explicit(&slots[i].ordinal, ordinal, memory_order_release);
            return;
        }
    for (size_t i = 0; i < SLOTS; i++) {
        uintptr_t expected = EMPTY;
        if (atomic_compare_exchange_strong(&slots[i].ctx, &expected, CLAIMED)) {
            atomic_store_explicit(&slots[i].ordinal, ordinal, memory_order_relaxed);
            atomic_store_explicit(&slots[i].ctx, c, memory_order_release);
            return;
        }
    }
    static _Atomic int warned;
    if (!atomic_exchange(&warned, 1))
        shim_warn("cuda: more than %d live contexts: a freed block waits only for those of "
                  "them the shim served in, or the first %d made", SLOTS, SLOTS);
}

void shim_cuda_context_destroyed(CUcontext ctx)
{
    uintptr_t c = (uintptr_t)ctx;
    if (c <= CLAIMED)
        return;
    for (size_t i = 0; i < SLOTS; i++) {
        uintptr_t expected = c;
        atomic_compare_exchange_strong(&slots[i].ctx, &expected, EMPTY);
    }
}

size_t shim_cuda_contexts_of(int ordinal, uintptr_t *out, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < SLOTS && n < max; i++) {
        uintptr_t c = atomic_load_explicit(&slots[i].ctx, memory_order_acquire);
        if (c > CLAIMED && atomic_load_explicit(&slots[i].ordinal, memory_order_acquire) == ordinal)
            out[n++] = c;
    }
    return n;
}
