/* Bounded waits on the monotonic clock: the one deadline helper and the one
 * way to make a condition variable whose timed waits use that clock. Every
 * bounded wait of the shim (the pressure event, the lifecycle gate, the GC
 * thread, the trace writer) goes through these, so that setting the wall
 * clock neither stretches nor cuts a wait. */
#ifndef SHIM_CLOCK_H
#define SHIM_CLOCK_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC (durations; never the wall clock). */
uint64_t shim_now_ns(void);

/* *deadline = now + ms on CLOCK_MONOTONIC, for pthread_cond_timedwait on a
 * condition variable made by shim_cond_init_monotonic. */
void shim_deadline_after_ms(struct timespec *deadline, unsigned ms);

/* Initializes *cv so that its timed waits read CLOCK_MONOTONIC. Also the
 * way to re-initialize it in a fork child. */
void shim_cond_init_monotonic(pthread_cond_t *cv);

#endif
