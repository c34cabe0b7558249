/* Allocation sequence numbers: the counter, the epoch that marks advance,
 * and each thread's batch (seq.h says how they fit; seq_take,
 * which every allocation inlines, is there). Lock-free: the counter and
 * the epoch are atomics on lines of their own, the batch is the thread's.
 * Never takes a lock, never blocks. */
#include <stdatomic.h>
#include <stdint.h>

#include "device_internal.h"

_Alignas(64) _Atomic uint64_t seq_counter;
_Alignas(64) _Atomic uint64_t seq_epoch;
static _Alignas(64) char seq_epoch_end_[1] __attribute__((unused));
__thread __attribute__((tls_model("initial-exec"))) struct shim_seq_batch tls_seq;
_Atomic bool seq_one_by_one;

uint64_t shim_device_seq_next(void)
{
    return seq_take();
}

uint64_t shim_device_seq_now(void)
{
    /* The counter first, then the epoch: a batch taken before the read is
     * at or below it, and no thread uses a batch from before the epoch
     * advanced once the mark is taken (seq_take). */
    uint64_t now = atomic_load_explicit(&seq_counter, memory_order_seq_cst);
    atomic_fetch_add_explicit(&seq_epoch, 1, memory_order_seq_cst);
    return now;
}
