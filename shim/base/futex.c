/* A futex word to sleep on and wake (futex.h).
 *
 * Owns nothing: the words are the callers'. No lock; both calls are one
 * system call each, so a signal handler may make them (tracewriter.c's
 * flush on SIGTERM). The deadline is absolute on CLOCK_MONOTONIC
 * (FUTEX_WAIT_BITSET without FUTEX_CLOCK_REALTIME), as every bounded wait
 * of the shim (clock.h): setting the wall clock changes nothing. */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "futex.h"

int shim_futex_wait_until(_Atomic uint32_t *w, uint32_t expected, uint64_t deadline_ns)
{
    if (shim_now_ns() >= deadline_ns)
        return ETIMEDOUT;
    struct timespec at = {(time_t)(deadline_ns / 1000000000u), (long)(deadline_ns % 1000000000u)};
    long r = syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT_BITSET_PRIVATE, expected, &at, NULL,
                     FUTEX_BITSET_MATCH_ANY);
    return r != 0 && errno == ETIMEDOUT ? ETIMEDOUT : 0;
}

void shim_futex_wake_all(_Atomic uint32_t *w)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}
