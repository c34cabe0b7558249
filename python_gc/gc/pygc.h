/* Garbage collection in whatever Python the process already embeds, run as
 * a pressure callback. */
#ifndef SHIM_PYGC_H
#define SHIM_PYGC_H

#include <stdint.h>
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
/* The trace registers this at init: called after every collection made
 * for a pressure event (inline or on the GC thread), with its duration,
 * the device bytes freed meanwhile and the objects collected. No allocator
 * lock held; the GIL may be. */
typedef void (*shim_pygc_collection_fn)(uint64_t ns, uint64_t freed, long objects);
void shim_pygc_set_collection_hook(shim_pygc_collection_fn fn);
/* fork(): the child has no GC thread; it is started again on demand. */
void shim_pygc_atfork_child(void);

#endif
