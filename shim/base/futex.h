/* A futex word to sleep on and wake (futex.c): what a signal handler may
 * use to wake a thread and wait for its answer (both are one system call,
 * no lock, async-signal-safe), where a condition variable may not be
 * touched. */
#ifndef SHIM_FUTEX_H
#define SHIM_FUTEX_H

#include <stdatomic.h>
#include <stdint.h>

/* Sleeps while *w == expected, until woken or CLOCK_MONOTONIC passes
 * deadline_ns (shim_now_ns's clock). Returns 0 when woken or *w differed
 * (the caller looks again), ETIMEDOUT once the deadline passed. */
int shim_futex_wait_until(_Atomic uint32_t *w, uint32_t expected, uint64_t deadline_ns);
/* Wakes every thread sleeping on w. */
void shim_futex_wake_all(_Atomic uint32_t *w);

#endif
