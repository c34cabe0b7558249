/* What Python held when the interpreter began to shut down (shutdown.c). */
#ifndef SHIM_LEAK_SHUTDOWN_H
#define SHIM_LEAK_SHUTDOWN_H

#include "spyreshim.h"

/* Asks the interpreter's exit gate to take, when it closes (the start of
 * shutdown, GIL held), a collection and then a copy of the live records.
 * Idempotent; called once a Python stack was recorded. */
void shim_shutdown_watch(void);
/* That copy (the caller frees it), or NULL when no interpreter began to
 * shut down (no Python, PyPy, or the program never allocated from it). */
spyreshim_snapshot *shim_shutdown_take(void);

#endif
