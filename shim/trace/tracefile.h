/* The trace file: in-memory buffers of events, the shim's own writer
 * thread that appends them to the file in large writes, the interned
 * (native stack, Python stack) sites, and the metadata that makes the file
 * readable on its own. See tracefile.c and docs/trace-format.md. */
#ifndef SHIM_TRACEFILE_H
#define SHIM_TRACEFILE_H

#include <stdbool.h>
#include <stdint.h>

/* From the constructor: remembers the path template and the flush
 * interval. Nothing is opened or started until the first event. */
void shim_tracefile_init(const char *path_template, unsigned flush_ms);
/* Records one event (enum trace_kind). Copies 32 bytes into the calling
 * thread's own buffer, with no lock; the buffer lock (a leaf) only when
 * the buffer fills, on a site new to the thread, and on the thread's first
 * event. Never does I/O, never waits for the file. Starts the writer
 * thread on first use. */
void shim_tracefile_append(unsigned kind, unsigned device, uint64_t seq, uint64_t addr,
                           uint64_t size, uint32_t native_stack, uint32_t python_stack);
/* From the library destructor: stops recording, writes what is buffered,
 * then names for every native frame and every Python stack, and closes. */
void shim_tracefile_close(void);
/* fork(): both locks are held across fork by the forking thread; the child
 * drops the parent's buffered events (every thread's) and writes a file of
 * its own when the path has %p (otherwise it records nothing: the file is
 * the parent's). */
void shim_tracefile_atfork_prepare(void);
void shim_tracefile_atfork_parent(void);
void shim_tracefile_atfork_child(void);

#endif
