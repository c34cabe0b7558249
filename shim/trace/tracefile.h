/* The trace file (tracefile.c): its path, its header, its chunk records
 * and the metadata that makes it readable on its own (devices, sites,
 * native stacks, the module map). The layout is tracefmt.h and
 * docs/trace-format.md. Every function but init is called with the trace
 * write lock held (tracewriter.c), off the allocating threads. */
#ifndef SHIM_TRACEFILE_H
#define SHIM_TRACEFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tracefmt.h"

/* Metadata records being built for one chunk record. */
struct trace_meta_buf {
    char *p;
    size_t len, cap;
    bool oom;     /* out of host memory: the records are dropped */
};

/* From the constructor: remembers the path template (%p = pid). False
 * when it is empty or too long (nothing is recorded). Nothing is opened
 * until the first write. */
bool shim_tracefile_init(const char *path_template);

/* Room for `more` bytes in m (sets m->oom when there is none). */
void shim_tracefile_meta_reserve(struct trace_meta_buf *m, size_t more);
/* One record: tag, length, then the payload from the two pieces, padded
 * to 8 bytes. */
void shim_tracefile_meta_add(struct trace_meta_buf *m, uint32_t tag, const void *a, size_t alen,
                             const void *b, size_t blen);
/* The devices, sites and native stacks (and then the module map) that the
 * file does not have yet, for events about to be written. Call after the
 * events were taken from the buffers: their sites are interned by then. */
void shim_tracefile_meta_new(struct trace_meta_buf *m);
/* The native stacks the file has, in the order written. */
size_t shim_tracefile_native_stacks(const uint32_t **ids);

/* Opens the file on first use (the one safe-open policy) and writes the
 * header. False when it cannot be (recording then stops, with one
 * warning) or writing failed before. */
bool shim_tracefile_ready(void);
bool shim_tracefile_failed(void);
/* Open and not failed: what was written so far can be completed. */
bool shim_tracefile_writable(void);
/* One chunk record: events ev[0..n) of the thread numbered `thread`
 * (`ref` is the whole sequence number of one event of the buffer they
 * come from), encoded (tracecodec.c; compressed when `compress` and zlib
 * is there), then the metadata m. */
void shim_tracefile_write_chunk(const trace_event *ev, uint32_t n, uint64_t ref, uint32_t thread,
                                bool compress, const struct trace_meta_buf *m);
/* The last record at the process's exit (after the names): the file
 * reached it. */
void shim_tracefile_end(void);
/* The last record when SIGTERM's default action ends the process
 * (tracewriter.c, asked by the shim's handler): nothing is written after
 * it. */
void shim_tracefile_end_by_signal(int sig);
/* How many sites the file has (their records written). */
uint32_t shim_tracefile_sites(void);
void shim_tracefile_close(void);
/* The path of the file this process wrote (`%p` expanded, a `.N` suffix
 * where the path was taken) into path[n] and the events in it; false when
 * it opened none. */
bool shim_tracefile_written(char *path, size_t n, uint64_t *events);
/* fork() child: the parent's file is closed here, never written; with %p
 * in the path the child writes a file of its own (every site and stack
 * again), without it the child records nothing. */
void shim_tracefile_atfork_child(void);

#endif
