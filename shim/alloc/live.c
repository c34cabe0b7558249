/* The process's live bytes: every device's, summed in the steps each
 * device's own total takes (LIVE_STEP, device_internal.h), and the highest
 * such sum, the process's peak (the peak of the sum, not the sum of the
 * devices' peaks). Written by publish_live, which every path that settles
 * a shard reaches (device.c's freed-bytes count included), so it sits
 * below the device's files; read by statistics. Atomics, no lock. */
#include <stdatomic.h>
#include <stdint.h>

#include "device_internal.h"

_Atomic int64_t live_all;
_Atomic uint64_t peak_all;

uint64_t shim_device_peak_all(void)
{
    return atomic_load_explicit(&peak_all, memory_order_relaxed);
}

void shim_device_peak_all_reset(void)
{
    int64_t live = atomic_load_explicit(&live_all, memory_order_relaxed);
    atomic_store_explicit(&peak_all, live > 0 ? (uint64_t)live : 0, memory_order_relaxed);
}
