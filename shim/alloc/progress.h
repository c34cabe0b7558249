/* Waits for pressure work done on another thread, bounded by that work's
 * progress rather than by the wall clock (progress.c). */
#ifndef SHIM_PROGRESS_H
#define SHIM_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* The work's progress: a count that grows while the work gets somewhere,
 * in nanoseconds of CPU time (python_gc registers the CPU time of the
 * threads inside a collection). Called by waiting threads, possibly with
 * an allocator lock held: it may take only a leaf lock. */
typedef uint64_t (*shim_progress_fn)(void);
void shim_progress_set_source(shim_progress_fn fn);

/* A wait in stretches of `stretch_ms` (SPYRESHIM_GC_TIMEOUT_MS): it goes on
 * past a stretch in which the work used at least 1% of it in CPU time (1 ms
 * at least), and ends after one in which it did not (a finalizer blocked
 * on a lock, a thread waiting for a GIL that will not come), or after
 * SHIM_PROGRESS_CAP stretches in all (a finalizer that spins forever). */
#define SHIM_PROGRESS_CAP 30
typedef struct shim_progress_wait {
    uint64_t start_ns, stretch_ns, mark;
    unsigned stretches;
    struct timespec deadline;  /* the current stretch's end, CLOCK_MONOTONIC */
    bool stalled;              /* it ended for want of progress (else the cap) */
} shim_progress_wait;

void shim_progress_wait_begin(shim_progress_wait *w, unsigned stretch_ms);
/* The current stretch has ended: true, with w->deadline moved on by one
 * stretch, when the wait goes on. */
bool shim_progress_wait_extend(shim_progress_wait *w);
/* Whether the current stretch has ended (for waits that poll). */
bool shim_progress_wait_past(const shim_progress_wait *w);
/* Milliseconds since shim_progress_wait_begin. */
double shim_progress_wait_ms(const shim_progress_wait *w);

#endif
