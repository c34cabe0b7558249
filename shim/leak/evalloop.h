/* Where CPython's evaluation loop lies in memory, for the splice of Python
 * frames into native stacks when its parts have no symbol. See evalloop.c. */
#ifndef SHIM_EVALLOOP_H
#define SHIM_EVALLOOP_H

#include <stdbool.h>
#include <stdint.h>

#define SHIM_EVALLOOP_PARTS 8

typedef struct shim_evalloop {
    unsigned n;                          /* 0: nothing known */
    uintptr_t lo[SHIM_EVALLOOP_PARTS], hi[SHIM_EVALLOOP_PARTS];
} shim_evalloop;

/* Fills *e from the exported entry `entry` of _PyEval_EvalFrameDefault (0:
 * nothing). */
void shim_evalloop_find(uintptr_t entry, shim_evalloop *e);
/* Whether return address `pc` is inside one of the parts. */
bool shim_evalloop_contains(const shim_evalloop *e, uintptr_t pc);

#endif
