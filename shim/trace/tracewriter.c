/* The trace's writer (tracewriter.h): the shim's own thread, started with
 * the first event, all signals blocked, that writes full chunks as soon as
 * they fill and, every SPYRESHIM_TRACE_FLUSH_MS (at most a second), what
 * every thread's current chunk holds past what was written, so that a
 * SIGKILL loses at most that much (a chunk record cut by the kill is
 * dropped by the reader). Chunks of different threads are written in any
 * order: the sequence number in each event is the order.
 *
 * Owns the thread and its snapshot of the buffers. Locks
 * (docs/locking.md): `write_mu`, the trace write lock, guards the file
 * (tracefile.c) and what it has been given; held across the file's I/O,
 * taken before the buffer and site locks. Never does I/O with the buffer
 * or site lock held, never calls into the allocator or Python. */
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "mutex.h"
#include "tracebuf.h"
#include "tracecodec.h"
#include "tracefile.h"
#include "tracenames.h"
#include "tracewriter.h"

static unsigned g_flush_ms = 1000;
static atomic_bool g_started;  /* the first event came: there are events to encode */
/* Full chunks one flush compresses at most (8192 events each); past that
 * the writer is behind, and writes them uncompressed. */
#define BACKLOG_COMPRESSED 4

/* Guarded by write_mu. */
static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER;
static struct trace_buf_span *spans;  /* the snapshot of threads' chunks */
static uint64_t events_written;       /* by this process, for the writer's cost */
static size_t spans_cap;

void shim_tracewriter_init(unsigned flush_ms)
{
    g_flush_ms = flush_ms ? flush_ms : 1000;
}

/* Writes every event published so far: the full chunks, then what each
 * thread's current chunk holds past what was written. write_mu held. */
static void flush_locked(void)
{
    struct trace_buf_chunk *list = NULL;
    size_t need, nspans;
    while ((nspans = shim_tracebuf_take(&list, spans, spans_cap, &need)) == TRACEBUF_MORE) {
        size_t cap = spans_cap ? spans_cap : 16;
        while (cap < need)
            cap *= 2;
        struct trace_buf_span *p = realloc(spans, cap * sizeof *p);
        if (!p) {
            /* Only the full chunks this time. */
            nspans = shim_tracebuf_take(&list, NULL, 0, NULL);
            break;
        }
        spans = p;
        spans_cap = cap;
    }

    /* A chunk in the queue is no thread's any more: its count is final.
     * A thread's current chunk is written up to the snapshot; the thread
     * appends past it meanwhile, never below. */
    if ((list || nspans) && shim_tracefile_ready()) {
        struct trace_meta_buf m = {0};
        shim_tracefile_meta_new(&m);
        bool meta_done = false;
        /* Compressing costs the writer some 1,100 instructions an event:
         * threads that fill chunks faster than that find it behind, with
         * full chunks waiting in memory. Then this batch goes uncompressed
         * (a third of the work, the same file format) and the writer
         * catches up; the next batches are small again. */
        size_t queued = 0;
        for (struct trace_buf_chunk *c = list; c; c = c->next)
            queued++;
        bool compress = queued <= BACKLOG_COMPRESSED;
        for (struct trace_buf_chunk *c = list; c && !shim_tracefile_failed(); c = c->next) {
            uint32_t end = atomic_load_explicit(&c->n, memory_order_acquire);
            if (end <= c->written)
                continue;
            events_written += end - c->written;
            shim_tracefile_write_chunk(c->ev + c->written, end - c->written,
                                       atomic_load_explicit(&c->last_seq, memory_order_relaxed),
                                       c->thread, compress, meta_done ? NULL : &m);
            meta_done = true;
            c->written = end;
        }
        for (size_t i = 0; i < nspans && !shim_tracefile_failed(); i++) {
            struct trace_buf_chunk *c = spans[i].c;
            events_written += spans[i].end - c->written;
            shim_tracefile_write_chunk(c->ev + c->written, spans[i].end - c->written,
                                       atomic_load_explicit(&c->last_seq, memory_order_relaxed),
                                       c->thread, compress, meta_done ? NULL : &m);
            meta_done = true;
            c->written = spans[i].end;
        }
        if (!meta_done && m.len && !shim_tracefile_failed())
            shim_tracefile_write_chunk(NULL, 0, 0, 0, false, &m);
        free(m.p);
    }
    shim_tracebuf_recycle(list);
}

static void *writer_main(void *arg)
{
    (void)arg;
    shim_tracecodec_load(); /* a loader call: before any lock of ours */
    uint64_t mine = 0;      /* events this thread wrote (the rest: at exit) */
    for (;;) {
        struct timespec deadline;
        shim_deadline_after_ms(&deadline, g_flush_ms);
        if (!shim_tracebuf_wait(&deadline)) {
            /* What encoding costs (bench/trace_overhead.sh has the
             * instructions): the thread's own CPU time. */
            struct timespec cpu;
            if (shim_log_enabled(SHIM_LOG_DEBUG) &&
                clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
                uint64_t n = mine;
                double s = (double)cpu.tv_sec + (double)cpu.tv_nsec / 1e9;
                shim_debug("trace: the writer thread wrote %llu events with %.3f s of CPU "
                           "(%.0f ns an event)", (unsigned long long)n, s,
                           n ? s * 1e9 / (double)n : 0.0);
            }
            return NULL;
        }
        shim_mutex_lock(&write_mu);
        uint64_t before = events_written;
        flush_locked();
        mine += events_written - before;
        shim_mutex_unlock(&write_mu);
    }
}

void shim_tracewriter_start(void)
{
    atomic_store(&g_started, true);
    /* The writer must never take a signal meant for the program. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, writer_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        shim_warn("trace: cannot start the writer thread (%s); the trace is written at exit only",
                  strerror(rc));
}

void shim_tracewriter_close(void)
{
    /* Loaded by the writer thread already, unless it never ran; not at
     * all in a process that recorded no event. */
    if (atomic_load(&g_started))
        shim_tracecodec_load();
    shim_mutex_lock(&write_mu);
    uint64_t lost;
    if (shim_tracebuf_close(&lost)) {
        flush_locked();
        if (shim_tracefile_writable()) {
            /* Names come from the loader (symbolization): never with a
             * lock of ours held (docs/locking.md). The buffers are closed,
             * which keeps every other writer out meanwhile. */
            shim_mutex_unlock(&write_mu);
            struct trace_meta_buf m = {0};
            shim_tracenames_add(&m);
            shim_mutex_lock(&write_mu);
            if (!m.oom && !shim_tracefile_failed())
                shim_tracefile_write_chunk(NULL, 0, 0, 0, false, &m);
            free(m.p);
            shim_tracefile_end();
        }
        if (lost)
            shim_warn("SPYRESHIM_TRACE: %llu events were not recorded (out of host memory)",
                      (unsigned long long)lost);
    }
    shim_tracefile_close();
    shim_tracebuf_stop();
    static char path[4096];   /* exit's thread only, once */
    uint64_t events = 0;
    bool note = shim_opts()->trace_note && shim_tracefile_written(path, sizeof path, &events);
    shim_mutex_unlock(&write_mu);
    /* `spyreshim run --trace` asks: which file, among PATH, PATH.2, ... or
     * one per process, is this one's. */
    if (note)
        shim_log(SHIM_LOG_WARN, "trace written to %s (%llu events)", path,
                 (unsigned long long)events);
}

void shim_tracewriter_atfork_prepare(void) { shim_mutex_lock(&write_mu); }
void shim_tracewriter_atfork_parent(void) { shim_mutex_unlock(&write_mu); }
void shim_tracewriter_atfork_child(void) { shim_mutex_unlock(&write_mu); }
