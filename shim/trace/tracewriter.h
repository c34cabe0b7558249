/* The trace's writer (tracewriter.c): the shim's own thread that moves
 * recorded events from the buffers to the file, and the last write at
 * exit. */
#ifndef SHIM_TRACEWRITER_H
#define SHIM_TRACEWRITER_H

#include <stdbool.h>

/* From the constructor: the flush interval (SPYRESHIM_TRACE_FLUSH_MS). */
void shim_tracewriter_init(unsigned flush_ms);
/* The first event of the process, or of a fork child (tracebuf.c calls
 * it): opens the file (the path is claimed from then on) and starts the
 * writer thread. */
void shim_tracewriter_start(void);
/* From the SIGTERM handler (shim/base/sigterm.c): asks the writer for a
 * flush of every event published so far and their names, and waits for
 * it, 2 seconds at most. `dies`: the default action follows, the flush
 * ends the file with a state record saying so. Async-signal-safe. */
void shim_tracewriter_signal_flush(bool dies);
/* From the library destructor: stops recording, writes what is buffered,
 * then the names of every native frame and Python stack, and closes. */
void shim_tracewriter_close(void);
/* fork(): the write lock is held across fork, taken first of the trace's. */
void shim_tracewriter_atfork_prepare(void);
void shim_tracewriter_atfork_parent(void);
void shim_tracewriter_atfork_child(void);

#endif
