/* The trace's event buffers (tracebuf.c): one per recording thread, each
 * a chunk of 8192 events appended to with no lock; full chunks queued for
 * the writer (tracewriter.c), which also reads the current chunks up to
 * what their threads published. */
#ifndef SHIM_TRACEBUF_H
#define SHIM_TRACEBUF_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tracefmt.h"

#define TRACE_EV_PER_CHUNK 8192

struct trace_buf_chunk {
    struct trace_buf_chunk *next; /* in the full queue or the free list (buffer lock) */
    _Atomic uint32_t n;           /* events published by the owning thread */
    uint32_t written;             /* of those, how many are in the file (the writer's) */
    uint32_t thread;              /* the owning thread's number (set before it is published) */
    _Atomic uint64_t last_seq;    /* the newest event's whole sequence number: events
                                     carry its low 32 bits, the writer the rest */
    trace_event ev[TRACE_EV_PER_CHUNK];
};

/* The part of a thread's current chunk to write: up to `end`. */
struct trace_buf_span {
    struct trace_buf_chunk *c;
    uint32_t end;
};

/* From the constructor (through trace.c): recording on. `first_event` runs
 * once, at the first event of the process (or of a fork child): it starts
 * the writer. */
void shim_tracebuf_init(void (*first_event)(void));
/* Recording stops (the file failed, exit, a fork child without its own
 * file); an append already past the check may still land. */
void shim_tracebuf_stop(void);
/* The moment recording began, on each clock (the file's header). */
uint64_t shim_tracebuf_start_monotonic_ns(void);
uint64_t shim_tracebuf_start_realtime_ns(void);

/* Records one event (enum trace_kind): 32 bytes into the calling thread's
 * own chunk, no lock; the buffer lock (a leaf) only when the chunk fills
 * and at the thread's first event, the site lock for a site new to the
 * thread. Never does I/O, never waits for the file. */
void shim_tracebuf_append(unsigned kind, unsigned device, uint64_t seq, uint64_t addr,
                          uint64_t size, uint32_t native_stack, uint32_t python_stack);

/* The writer's side. Waits until a chunk is full, recording closes,
 * shim_tracebuf_wake is called or CLOCK_MONOTONIC passes deadline_ns;
 * false once closed. */
bool shim_tracebuf_wait(uint64_t deadline_ns);
/* Wakes the writer's wait: async-signal-safe (an atomic and a futex). */
void shim_tracebuf_wake(void);
#define TRACEBUF_MORE ((size_t)-1)
/* Takes the queue of full chunks (*full; no thread's any more: their
 * counts are final) and a snapshot of every thread's current chunk past
 * what was written (spans[0..cap)), under one hold of the buffer lock;
 * returns the number of spans. With more threads than `cap`, takes nothing
 * and returns TRACEBUF_MORE with *need set. With `need` NULL, takes the
 * full chunks only (no memory for the snapshot). */
size_t shim_tracebuf_take(struct trace_buf_chunk **full, struct trace_buf_span *spans, size_t cap,
                          size_t *need);
/* The full chunks taken, once written: kept for reuse (a few) or freed. */
void shim_tracebuf_recycle(struct trace_buf_chunk *list);
/* At exit: no more waiting, no more appends. Returns whether it was open
 * and the writer had started (there is something to write), and the
 * events lost for want of memory. */
bool shim_tracebuf_close(uint64_t *dropped);

/* fork(): the buffer lock is held across fork (after the writer's lock);
 * the child drops every thread's buffered events (they are the parent's). */
void shim_tracebuf_atfork_prepare(void);
void shim_tracebuf_atfork_parent(void);
void shim_tracebuf_atfork_child(void);

#endif
