/* The trace's event buffers (tracebuf.h): one per recording thread.
 *
 * Owns: each thread's buffer (its current chunk of 8192 events, 256 KiB,
 * and its cache of sites), the list of every thread's buffer, the queue of
 * full chunks, the free list of chunks, the switch that says recording is
 * on, and the time base of the events.
 *
 * The append path takes no lock: each thread appends to its own chunk and
 * publishes the count with a release store; the site of an event comes
 * from the thread's own cache of the site table (tracesites.c). Threads
 * meet only when a chunk fills (once per 8192 events), on a site the
 * thread has not seen, and at a thread's first event and its exit. The
 * writer (tracewriter.c) reads the events a thread published so far
 * without stopping it: never an event past the published count.
 *
 * Locks (docs/locking.md): `buf_mu`, the trace buffer lock, guards the
 * list of buffers, the queue of full chunks and the free list. A leaf,
 * taken only off the common path (see above), possibly with an allocator
 * lock held (markers of a pressure event, allocations by a callback that
 * holds the lock) or the GIL (collection markers). Never does I/O, never
 * calls into the allocator or Python. A thread that exits hands its chunk
 * to the writer (a pthread key destructor). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "futex.h"
#include "mutex.h"
#include "tracebuf.h"
#include "tracesites.h"

#define FREE_CHUNKS_KEPT 8
#define SITE_CACHE 64 /* per thread, direct-mapped; a power of two */

/* One recording thread's buffer. `cur` and the list links change under
 * buf_mu; the owning thread reads `cur` and the cache without it (it is
 * the only one that changes them). */
struct tbuf {
    struct tbuf *next, *prev;
    struct trace_buf_chunk *cur;
    uint32_t number;             /* the thread's number in the process, from 1 */
    struct {
        uint64_t key;            /* nstack << 32 | pystack; 0 = empty */
        uint32_t site;
    } cache[SITE_CACHE];
};

/* Written once by shim_tracebuf_init (and cleared by stop). */
static atomic_bool g_on;
static uint64_t g_start_mono, g_start_real;
static void (*g_first_event)(void);
static pthread_key_t g_key;      /* a thread's tbuf: its destructor hands the chunk over */
static bool g_key_ok;
/* initial-exec: no __tls_get_addr call per event. The shim is preloaded
 * (static TLS); a dlopen finds these 8 bytes in glibc's surplus. */
static __thread struct tbuf *tls_buf __attribute__((tls_model("initial-exec")));
static _Atomic uint64_t dropped;
static atomic_bool first_done;
/* Bumped to wake the writer (a chunk is full, recording closed, a flush is
 * asked for from a signal handler): a futex word, no lock. */
static _Atomic uint32_t wake_word;

/* Guarded by buf_mu. */
static pthread_mutex_t buf_mu = PTHREAD_MUTEX_INITIALIZER;
static struct tbuf *threads;     /* every thread's buffer */
static size_t nthreads;
static uint32_t thread_numbers;  /* given so far: each buffer its own (chunk headers) */
static struct trace_buf_chunk *full_head, *full_tail, *free_list;
static unsigned free_count;
static bool closed;

static uint64_t now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void tbuf_exit(void *arg);

void shim_tracebuf_init(void (*first_event)(void))
{
    g_first_event = first_event;
    /* Without the key a thread's buffer outlives it: its events are still
     * written (the writer finds the buffer in the list), only the memory
     * stays. */
    g_key_ok = pthread_key_create(&g_key, tbuf_exit) == 0;
    g_start_mono = now_ns(CLOCK_MONOTONIC);
    g_start_real = now_ns(CLOCK_REALTIME);
    atomic_store(&g_on, true);
}

void shim_tracebuf_stop(void)
{
    atomic_store(&g_on, false);
}

uint64_t shim_tracebuf_start_monotonic_ns(void) { return g_start_mono; }
uint64_t shim_tracebuf_start_realtime_ns(void) { return g_start_real; }

/* ---- chunks (buf_mu held) ---- */

/* A chunk from the free list, or NULL. */
static struct trace_buf_chunk *chunk_reuse(void)
{
    struct trace_buf_chunk *c = free_list;
    if (c) {
        free_list = c->next;
        free_count--;
    }
    return c;
}

static void chunk_reset(struct trace_buf_chunk *c)
{
    c->next = NULL;
    atomic_store_explicit(&c->n, 0, memory_order_relaxed);
    atomic_store_explicit(&c->last_seq, 0, memory_order_relaxed);
    c->written = 0;
}

static void queue_full(struct trace_buf_chunk *c)
{
    c->next = NULL;
    if (full_tail)
        full_tail->next = c;
    else
        full_head = c;
    full_tail = c;
}

/* ---- a thread's buffer ---- */

/* The calling thread's first event: its buffer, in the list the writer
 * reads. The chunk is allocated before buf_mu is taken. */
static struct tbuf *tbuf_new(void)
{
    struct tbuf *tb = calloc(1, sizeof *tb);
    struct trace_buf_chunk *c = malloc(sizeof *c);
    if (!tb || !c) {
        free(tb);
        free(c);
        return NULL;
    }
    chunk_reset(c);
    tb->cur = c;
    shim_mutex_lock(&buf_mu);
    tb->number = c->thread = ++thread_numbers;
    tb->next = threads;
    if (threads)
        threads->prev = tb;
    threads = tb;
    nthreads++;
    shim_mutex_unlock(&buf_mu);
    tls_buf = tb;
    if (g_key_ok)
        pthread_setspecific(g_key, tb);
    if (!atomic_exchange(&first_done, true) && g_first_event)
        g_first_event();
    return tb;
}

/* Thread exit (the key's destructor): the chunk goes to the writer's
 * queue, the buffer leaves the list. A later event of this thread (another
 * destructor that allocates) starts a new buffer. */
static void tbuf_exit(void *arg)
{
    struct tbuf *tb = arg;
    if (tls_buf == tb)
        tls_buf = NULL;
    shim_mutex_lock(&buf_mu);
    if (tb->prev)
        tb->prev->next = tb->next;
    else
        threads = tb->next;
    if (tb->next)
        tb->next->prev = tb->prev;
    nthreads--;
    struct trace_buf_chunk *c = tb->cur;
    if (c && atomic_load_explicit(&c->n, memory_order_relaxed) > c->written)
        queue_full(c);
    else
        free(c);
    shim_mutex_unlock(&buf_mu);
    free(tb);
}

/* The thread's chunk is full (or there is none): it goes to the writer,
 * and a fresh one replaces it. Returns NULL when there is no memory. */
static struct trace_buf_chunk *chunk_swap(struct tbuf *tb)
{
    shim_mutex_lock(&buf_mu);
    if (tb->cur)
        queue_full(tb->cur);
    /* Reset before it is published: the writer may look at it at once. */
    struct trace_buf_chunk *c = chunk_reuse();
    if (c) {
        chunk_reset(c);
        c->thread = tb->number;
    }
    tb->cur = c;
    shim_mutex_unlock(&buf_mu);
    shim_tracebuf_wake();
    if (!c) {
        c = malloc(sizeof *c);
        if (!c)
            return NULL;
        chunk_reset(c);
        c->thread = tb->number;
        shim_mutex_lock(&buf_mu);
        tb->cur = c;
        shim_mutex_unlock(&buf_mu);
    }
    return c;
}

/* A pair this thread's cache does not have: the shared table. */
static uint32_t site_slow(struct tbuf *tb, unsigned slot, uint64_t key)
{
    uint32_t id = shim_tracesites_intern((uint32_t)(key >> 32), (uint32_t)key);
    if (id) {
        tb->cache[slot].key = key;
        tb->cache[slot].site = id;
    }
    return id;
}

void shim_tracebuf_append(unsigned kind, unsigned device, uint64_t seq, uint64_t addr,
                          uint64_t size, uint32_t native_stack, uint32_t python_stack)
{
    if (__builtin_expect(!atomic_load_explicit(&g_on, memory_order_relaxed), 0))
        return;
    struct tbuf *tb = tls_buf;
    if (__builtin_expect(!tb, 0) && !(tb = tbuf_new())) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    struct trace_buf_chunk *c = tb->cur;
    if (__builtin_expect(!c, 0) && !(c = chunk_swap(tb))) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    uint64_t key = (uint64_t)native_stack << 32 | python_stack;
    uint32_t site = 0;
    if (key) {
        unsigned slot = (unsigned)((key * 0x9e3779b97f4a7c15ULL) >> 58) & (SITE_CACHE - 1);
        site = tb->cache[slot].key == key ? tb->cache[slot].site : site_slow(tb, slot, key);
    }
    /* Only this thread writes n: a relaxed load of its own store. */
    uint32_t n = atomic_load_explicit(&c->n, memory_order_relaxed);
    trace_event *e = &c->ev[n];
    e->addr = addr;
    e->size_kind_dev = (size & TRACE_SIZE_MASK) | (uint64_t)(kind & 0xff) << 48 |
                       (uint64_t)(device & 0xff) << 56;
    e->time_ns = now_ns(CLOCK_MONOTONIC) - g_start_mono;
    e->seq_lo = (uint32_t)seq;
    e->site = site;
    atomic_store_explicit(&c->last_seq, seq, memory_order_relaxed);
    /* Release: the writer that reads n sees the event (and the site it
     * names, interned before). */
    atomic_store_explicit(&c->n, n + 1, memory_order_release);
    if (__builtin_expect(n + 1 == TRACE_EV_PER_CHUNK, 0))
        chunk_swap(tb);
}

/* ---- the writer's side ---- */

void shim_tracebuf_wake(void)
{
    atomic_fetch_add(&wake_word, 1);
    shim_futex_wake_all(&wake_word);
}

bool shim_tracebuf_wait(uint64_t deadline_ns)
{
    for (;;) {
        uint32_t w = atomic_load(&wake_word);
        shim_mutex_lock(&buf_mu);
        bool go = full_head || closed, open = !closed;
        shim_mutex_unlock(&buf_mu);
        /* Woken by anything but a chunk or the close (a signal's flush):
         * back to the writer all the same. */
        if (go || shim_futex_wait_until(&wake_word, w, deadline_ns) == ETIMEDOUT ||
            atomic_load(&wake_word) != w)
            return open;
    }
}

size_t shim_tracebuf_take(struct trace_buf_chunk **full, struct trace_buf_span *spans, size_t cap,
                          size_t *need)
{
    shim_mutex_lock(&buf_mu);
    bool full_only = !need;
    if (!full_only && nthreads > cap) {
        *need = nthreads;
        shim_mutex_unlock(&buf_mu);
        return TRACEBUF_MORE;
    }
    *full = full_head;
    full_head = full_tail = NULL;
    size_t n = 0;
    for (struct tbuf *tb = threads; !full_only && tb; tb = tb->next) {
        struct trace_buf_chunk *c = tb->cur;
        if (!c)
            continue;
        /* Acquire: the events below n are complete, their sites interned. */
        uint32_t end = atomic_load_explicit(&c->n, memory_order_acquire);
        if (end > c->written)
            spans[n++] = (struct trace_buf_span){c, end};
    }
    shim_mutex_unlock(&buf_mu);
    return n;
}

void shim_tracebuf_recycle(struct trace_buf_chunk *list)
{
    if (!list)
        return;
    shim_mutex_lock(&buf_mu);
    while (list) {
        struct trace_buf_chunk *next = list->next;
        if (free_count >= FREE_CHUNKS_KEPT) {
            free(list);
        } else {
            list->next = free_list;
            free_list = list;
            free_count++;
        }
        list = next;
    }
    shim_mutex_unlock(&buf_mu);
}

bool shim_tracebuf_close(uint64_t *lost)
{
    /* Appends stop here; one already past the check may still land in its
     * chunk and be written, or be lost, as if it came after. */
    atomic_store(&g_on, false);
    shim_mutex_lock(&buf_mu);
    bool was_closed = closed, any = atomic_load(&first_done);
    closed = true;
    *lost = atomic_load(&dropped);
    shim_mutex_unlock(&buf_mu);
    shim_tracebuf_wake();
    return !was_closed && any;
}

/* ---- fork ---- */

void shim_tracebuf_atfork_prepare(void) { shim_mutex_lock(&buf_mu); }
void shim_tracebuf_atfork_parent(void) { shim_mutex_unlock(&buf_mu); }

void shim_tracebuf_atfork_child(void)
{
    /* Every buffer is the parent's: the other threads do not exist here,
     * and the forking thread's events are the parent's too. They are all
     * dropped; this thread starts a new buffer, and with it the writer
     * thread (none exists here), with its next event. */
    struct trace_buf_chunk *c = full_head;
    while (c) {
        struct trace_buf_chunk *next = c->next;
        free(c);
        c = next;
    }
    full_head = full_tail = NULL;
    for (struct tbuf *tb = threads; tb;) {
        struct tbuf *next = tb->next;
        free(tb->cur);
        free(tb);
        tb = next;
    }
    threads = NULL;
    nthreads = 0;
    thread_numbers = 0;
    tls_buf = NULL;
    if (g_key_ok)
        pthread_setspecific(g_key, NULL);
    atomic_store(&first_done, false);
    shim_mutex_unlock(&buf_mu);
}
