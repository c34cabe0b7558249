/* One collection, with the GIL held. See collect.c. */
#ifndef SHIM_COLLECT_H
#define SHIM_COLLECT_H

#include <stdint.h>
#include "pyapi.h"

typedef struct shim_collect_result {
    long objects;      /* what gc.collect() returned (-1: it raised) */
    uint64_t ns;       /* time inside the interpreter's collector */
    uint64_t freed;    /* device bytes freed (any thread) meanwhile */
    int rounds;        /* collect(+flush) rounds: 1 on CPython */
} shim_collect_result;

/* gc.collect() semantics with the GIL held: a full collection even when
 * the program disabled the collector; the error indicator saved and
 * restored; a collection already running returns 0 without recursing.
 * On PyPy, runs cpyext's deferred deallocations after collecting and
 * repeats while that keeps freeing device memory (a few rounds at most). */
void shim_collect_with_gil(const shim_pyapi *api, shim_collect_result *r);

/* Nanoseconds of CPU time the collections run by shim_collect_with_gil
 * have used, those in flight included (each thread's CPU clock, read
 * now): the progress that bounds the waits for them (progress.h). Takes a
 * leaf lock only. */
uint64_t shim_collect_progress(void);
void shim_collect_atfork_child(void);

#endif
