/* The shim's own GC thread: collects for threads that do not hold the GIL.
 * See gcthread.c. */
#ifndef SHIM_GCTHREAD_H
#define SHIM_GCTHREAD_H

#include <stdbool.h>
#include "collect.h"
#include "pyapi.h"

enum shim_gcthread_status {
    SHIM_GCT_COLLECTED,
    SHIM_GCT_TIMEOUT,        /* the bound passed; the collection goes on */
    SHIM_GCT_NOT_RUNNING,    /* interpreter not initialized or finalizing */
    SHIM_GCT_GATE_CLOSED,
    SHIM_GCT_NO_THREAD,      /* could not start the thread */
};

/* Asks the GC thread for a collection that starts after this call and
 * waits for it, bounded by its progress in stretches of `timeout_ms`
 * (shim/alloc/progress.h); on TIMEOUT one line says why (once per
 * collection). Never holds any lock of the caller's; takes only the GC
 * thread's leaf mutex (and the collector's progress lock, a leaf). `out`
 * is filled when COLLECTED. */
enum shim_gcthread_status shim_gcthread_collect(const shim_pyapi *api, unsigned timeout_ms,
                                                shim_collect_result *out);

/* A collection was requested and has not completed (one whose requester
 * timed out, for instance). */
bool shim_gcthread_busy(void);
/* Waits for the collection in flight to complete, bounded like
 * shim_gcthread_collect's wait (no line). */
bool shim_gcthread_wait_idle(unsigned timeout_ms);

/* Called once by the GC thread for every collection it runs (stats). */
typedef void (*shim_gcthread_observer)(const shim_collect_result *r);
void shim_gcthread_set_observer(shim_gcthread_observer fn);

/* PyPy: PyEval_InitThreads once, GIL held (any thread); and whether that
 * happened, so that a thread without the GIL knows whether waiting for it
 * is survivable. */
void shim_pypy_threads_init(const shim_pyapi *api);
bool shim_pypy_threads_ready(void);

void shim_gcthread_atfork_child(void);

#endif
