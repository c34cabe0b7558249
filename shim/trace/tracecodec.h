/* The events of a version 2 chunk record, encoded (tracecodec.c): columns
 * split into byte planes, the planes that hold one byte throughout stored
 * as that byte, the rest compressed with zlib when it is there. The layout
 * is tracefmt.h and docs/trace-format.md; the reader is
 * spyreshim/reading/tracecodec.py. Called by the writer
 * (tracefile.c) with the trace write lock held, never on an allocating
 * thread. */
#ifndef SHIM_TRACECODEC_H
#define SHIM_TRACECODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tracefmt.h"

/* Loads zlib (dlopen of libz.so.1, once): call with no lock of ours held
 * (a loader call, docs/locking.md), before the first encode. Without it,
 * or when compressing fails, chunks are written uncompressed (flag clear):
 * larger, never lost. */
void shim_tracecodec_load(void);

struct trace_encoded {
    const void *body;    /* body_bytes bytes, valid until the next encode */
    uint32_t body_bytes;
    uint32_t flags;      /* TRACE_CHUNK_ZLIB when the body is a zlib stream */
    uint64_t seq_base;   /* the smallest whole sequence number of the events */
};

/* Encodes ev[0..n) (n <= TRACE_EV_PER_CHUNK); `ref` is the whole
 * sequence number of one event of their buffer (each event carries the
 * low 32 bits: tracebuf.h). Compressed only when `compress` (the writer
 * is not behind), zlib loaded, and that is smaller. Trace write lock
 * held. */
void shim_tracecodec_encode(const trace_event *ev, uint32_t n, uint64_t ref, bool compress,
                            struct trace_encoded *out);

#endif
