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
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "futex.h"
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
/* The names token: whoever set it (under write_mu) names frames with
 * write_mu released (tracenames.c); the other waits on names_cv. */
static bool names_busy;
static pthread_cond_t names_cv = PTHREAD_COND_INITIALIZER;
static size_t nstacks_named;          /* the file's native stacks given to tracenames */

/* A flush asked for by the SIGTERM handler (shim/base/sigterm.c), which
 * waits for it at most SIGNAL_WAIT_MS: counters on futex words (no lock:
 * a signal handler bumps one and sleeps on the other). */
#define SIGNAL_WAIT_MS 2000
static _Atomic uint32_t sig_asked, sig_done;
static atomic_bool sig_dies;          /* the default action follows: the last flush */
static atomic_bool writer_alive;      /* the writer thread runs in this process */

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

/* The names of what the file was just given (tracenames.c), with
 * write_mu released meanwhile: symbolizing calls the loader. `final`: at
 * exit, every Python stack with what was resolved. write_mu held on entry
 * and on return. */
static void names_locked(bool final)
{
    if (names_busy || !shim_tracefile_writable())
        return;
    const uint32_t *ids;
    size_t n = shim_tracefile_native_stacks(&ids);
    uint32_t nsites = shim_tracefile_sites();
    size_t from = nstacks_named < n ? nstacks_named : n;
    uint32_t *mine = n > from ? malloc((n - from) * sizeof *mine) : NULL;
    if (mine)
        memcpy(mine, ids + from, (n - from) * sizeof *mine);
    size_t nmine = mine ? n - from : 0;
    nstacks_named = from + nmine;
    names_busy = true;
    shim_mutex_unlock(&write_mu);
    struct trace_meta_buf m = {0};
    shim_tracenames_add(&m, mine, nmine, nsites, final);
    free(mine);
    shim_mutex_lock(&write_mu);
    names_busy = false;
    pthread_cond_broadcast(&names_cv);
    if (m.len && !m.oom && shim_tracefile_writable())
        shim_tracefile_write_chunk(NULL, 0, 0, 0, false, &m);
    free(m.p);
}

static void *writer_main(void *arg)
{
    (void)arg;
    shim_tracecodec_load(); /* a loader call: before any lock of ours */
    uint64_t mine = 0;      /* events this thread wrote (the rest: at exit) */
    uint32_t answered = atomic_load(&sig_done);
    /* Names at most once a flush interval (a libdw session costs the
     * writer tens of milliseconds, during which full chunks queue up and
     * would go uncompressed), and with a signal's flush. */
    uint64_t names_at = shim_now_ns() + (uint64_t)g_flush_ms * 1000000u;
    for (;;) {
        bool open = true;
        /* A signal's flush asked for since the last one is not waited for. */
        if (atomic_load(&sig_asked) == answered)
            open = shim_tracebuf_wait(shim_now_ns() + (uint64_t)g_flush_ms * 1000000u);
        uint32_t asked = atomic_load(&sig_asked);
        if (!open)
            break;
        shim_mutex_lock(&write_mu);
        uint64_t before = events_written;
        flush_locked();
        mine += events_written - before;
        uint64_t now = shim_now_ns();
        if (asked != answered || now >= names_at) {
            names_locked(false);
            names_at = now + (uint64_t)g_flush_ms * 1000000u;
        }
        if (asked != answered && atomic_exchange(&sig_dies, false))
            shim_tracefile_end_by_signal(SIGTERM);
        shim_mutex_unlock(&write_mu);
        if (asked != answered) {
            answered = asked;
            atomic_store(&sig_done, asked);
            shim_futex_wake_all(&sig_done);
        }
    }
    /* What encoding costs (bench/trace_overhead.sh has the instructions):
     * the thread's own CPU time. */
    struct timespec cpu;
    if (shim_log_enabled(SHIM_LOG_DEBUG) && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0) {
        uint64_t n = mine;
        double s = (double)cpu.tv_sec + (double)cpu.tv_nsec / 1e9;
        shim_debug("trace: the writer thread wrote %llu events with %.3f s of CPU "
                   "(%.0f ns an event)", (unsigned long long)n, s,
                   n ? s * 1e9 / (double)n : 0.0);
    }
    /* No one answers a flush from here on: whoever waits, stops waiting. */
    atomic_store(&writer_alive, false);
    atomic_store(&sig_done, atomic_load(&sig_asked));
    shim_futex_wake_all(&sig_done);
    return NULL;
}

void shim_tracewriter_signal_flush(bool dies)
{
    int saved = errno;
    if (dies)
        atomic_store(&sig_dies, true);
    uint32_t mine = atomic_fetch_add(&sig_asked, 1) + 1;
    if (atomic_load(&writer_alive)) {
        shim_tracebuf_wake();
        uint64_t deadline = shim_now_ns() + (uint64_t)SIGNAL_WAIT_MS * 1000000u;
        for (;;) {
            uint32_t done = atomic_load(&sig_done);
            if ((int32_t)(done - mine) >= 0 ||
                shim_futex_wait_until(&sig_done, done, deadline) == ETIMEDOUT)
                break;
        }
    }
    errno = saved;
}

void shim_tracewriter_start(void)
{
    atomic_store(&g_started, true);
    /* The path is claimed now, at the first event, not at the first flush:
     * a second process given the same path while this one runs finds it
     * locked (tracefile.c). No writer exists yet, so the file is this
     * thread's alone (write_mu is not taken: the caller may hold an
     * allocator lock, and the writer takes the device list's under it). */
    if (!shim_tracefile_ready())
        return;
    atomic_store(&writer_alive, true);
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
        atomic_store(&writer_alive, false);
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
    /* The writer may be naming what it wrote last: its names come first. */
    while (names_busy)
        pthread_cond_wait(&names_cv, &write_mu);
    uint64_t lost;
    if (shim_tracebuf_close(&lost)) {
        flush_locked();
        /* The buffers are closed: the names of the last events, and every
         * Python stack with what was resolved, then the end. */
        names_locked(true);
        shim_tracefile_end();
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
void shim_tracewriter_atfork_child(void)
{
    /* No writer thread here: the child's starts with its first event; the
     * names token of the parent's is dropped, its names begin again. */
    atomic_store(&g_started, false);
    atomic_store(&writer_alive, false);
    names_busy = false;
    nstacks_named = 0;
    pthread_cond_init(&names_cv, NULL);
    shim_tracenames_atfork_child();
    shim_mutex_unlock(&write_mu);
}
