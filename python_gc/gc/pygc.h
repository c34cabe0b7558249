/* Garbage collection in whatever Python the process already embeds, run as
 * a pressure callback. */
#ifndef SHIM_PYGC_H
#define SHIM_PYGC_H

#include <stdio.h>
#include "spyreshim.h"

/* From the library constructor: registers the pressure callback unless
 * SPYRESHIM_GC=0. Finds no interpreter yet (that happens on demand). */
void shim_pygc_init(void);
/* Adds collection counters to *s. */
void shim_pygc_add_stats(spyreshim_stats *s);
/* Writes extra members of the SPYRESHIM_STATS object, each one preceded by
 * ",\n  " (the caller has already written the object's first member). */
void shim_pygc_write_json(FILE *f);
/* For the pressure event (pressure.c), around a wait for ANOTHER thread's
 * event: when the calling thread is attached to Python, detaches it
 * (PyEval_SaveThread) so that the collection that event runs can take the
 * GIL, or stop the world on free-threaded builds; otherwise does nothing and
 * returns NULL. shim_pygc_reattach(token) re-attaches (it waits for the
 * GIL). Call both WITHOUT the allocator lock (detach may look for the
 * interpreter, which takes the dynamic loader's lock). */
void *shim_pygc_detach(void);
void shim_pygc_reattach(void *token);
/* fork(): the child has no GC thread; it is started again on demand. */
void shim_pygc_atfork_child(void);

#endif
