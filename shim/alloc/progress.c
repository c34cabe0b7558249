/* Waits for pressure work on another thread, bounded by its progress.
 *
 * A collection needs CPU: on a machine whose CPUs are busy (load 20 on two
 * of them) a collection that takes 100 ms alone took 2.1 s of wall time,
 * and a wall-clock bound failed the very request it was rescuing (issue
 * 44). What must stay bounded is a wait for work that is not getting
 * anywhere: the GC thread waiting for a GIL whose holder waits for a lock
 * the requester holds, or a finalizer blocked on a lock. Neither uses CPU;
 * a collection that runs does. So a wait goes on, stretch after stretch,
 * while the work used CPU in the last one, and ends after the first
 * stretch without, or at a cap for work that spins forever.
 *
 * Owns: the progress source (set once at init). No lock; the source takes
 * its own leaf lock. */
#include <stdatomic.h>

#include "clock.h"
#include "progress.h"

static _Atomic(shim_progress_fn) source;

void shim_progress_set_source(shim_progress_fn fn)
{
    atomic_store(&source, fn);
}

static uint64_t progress_now(void)
{
    shim_progress_fn fn = atomic_load(&source);
    return fn ? fn() : 0;
}

void shim_progress_wait_begin(shim_progress_wait *w, unsigned stretch_ms)
{
    w->start_ns = shim_now_ns();
    w->stretch_ns = (uint64_t)(stretch_ms ? stretch_ms : 1) * 1000000u;
    w->mark = progress_now();
    w->stretches = 1;
    w->stalled = false;
    shim_deadline_after_ms(&w->deadline, stretch_ms ? stretch_ms : 1);
}

bool shim_progress_wait_extend(shim_progress_wait *w)
{
    uint64_t now = progress_now();
    uint64_t used = now - w->mark;
    uint64_t enough = w->stretch_ns / 100 > 1000000u ? w->stretch_ns / 100 : 1000000u;
    w->mark = now;
    if (used < enough) {
        w->stalled = true;
        return false;
    }
    if (w->stretches >= SHIM_PROGRESS_CAP)
        return false;
    w->stretches++;
    uint64_t ns = w->deadline.tv_nsec + w->stretch_ns;
    w->deadline.tv_sec += (time_t)(ns / 1000000000u);
    w->deadline.tv_nsec = (long)(ns % 1000000000u);
    return true;
}

bool shim_progress_wait_past(const shim_progress_wait *w)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > w->deadline.tv_sec ||
           (now.tv_sec == w->deadline.tv_sec && now.tv_nsec >= w->deadline.tv_nsec);
}

double shim_progress_wait_ms(const shim_progress_wait *w)
{
    return (double)(shim_now_ns() - w->start_ns) / 1e6;
}
