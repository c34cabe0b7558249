/* The trace file (tracefile.h; the layout is tracefmt.h and
 * docs/trace-format.md).
 *
 * Owns: the event buffers (one per recording thread: chunks of 8192
 * events, 256 KiB), the table of sites (a site is a (native stack, Python
 * stack) pair, interned so that an event carries one 32-bit id), the writer
 * thread, and the file.
 *
 * The append path takes no lock: each thread appends to its own chunk and
 * publishes the count with a release store; the site of an event comes
 * from a per-thread cache of the site table. Threads meet only when a
 * chunk fills (once per 8192 events), on a site the thread has not seen,
 * and on a thread's first event and its exit. The writer reads the events
 * a thread published so far without stopping it (it never touches an event
 * past the published count), so a thread's partial chunk reaches the file
 * at every flush interval. Chunks are written in any order across
 * threads: the sequence number in each event is the order (the reader
 * sorts by it).
 *
 * Locks (docs/locking.md): `buf_mu` guards the list of threads' buffers,
 * the queue of full chunks, the free list and the site table. It is a
 * leaf, taken only off the common path (see above), possibly with an
 * allocator lock held (markers of a pressure event, allocations by a
 * callback that holds the lock) or the GIL (collection markers). `write_mu`
 * guards the file and what has been written to it (sites, stacks, devices,
 * how much of each chunk); it is held across the file's I/O and taken
 * before `buf_mu`. Never does I/O with `buf_mu` held, never does I/O on the
 * allocating thread: the writer thread (or the destructor) writes. Never
 * calls into the allocator or Python.
 *
 * Crash safety: the writer thread flushes every SPYRESHIM_TRACE_FLUSH_MS
 * (at most a second), every thread's partial chunk included, and whenever
 * a chunk fills, so a SIGKILL loses at most that much; a chunk cut by the
 * kill is dropped by the reader. A thread that exits hands its chunk to the
 * writer (a pthread key destructor); at exit the destructor writes every
 * thread's; after fork() the child drops every buffer of the parent's. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "device.h"
#include "log.h"
#include "mutex.h"
#include "path.h"
#include "pystack.h"
#include "stack.h"
#include "symbolize.h"
#include "tracefile.h"
#include "tracefmt.h"

#define EV_PER_CHUNK 8192
#define FREE_CHUNKS_KEPT 8
#define PYSTACK_MAX_FRAMES 256
#define SITE_CACHE 64 /* per thread, direct-mapped; a power of two */

struct chunk {
    struct chunk *next;          /* in the full queue or the free list (buf_mu) */
    _Atomic uint32_t n;          /* events published by the owning thread */
    uint32_t written;            /* of those, how many are in the file (write_mu) */
    _Atomic uint64_t last_seq;   /* the newest event's whole sequence number: events
                                    carry its low 32 bits, the writer the rest */
    trace_event ev[EV_PER_CHUNK];
};

/* One recording thread's buffer. `cur` and the list links change under
 * buf_mu; the owning thread reads `cur` and the cache without it (it is
 * the only one that changes them). */
struct tbuf {
    struct tbuf *next, *prev;
    struct chunk *cur;
    struct {
        uint64_t key;            /* nstack << 32 | pystack; 0 = empty */
        uint32_t site;
    } cache[SITE_CACHE];
};

struct site {
    uint32_t nstack, pystack;
};

/* Configuration, written once by shim_tracefile_init. */
static char g_template[4096];
static unsigned g_flush_ms = 1000;
static uint64_t g_start_mono, g_start_real;
static atomic_bool g_on;
static pthread_key_t g_key;      /* a thread's tbuf: its destructor hands the chunk over */
static bool g_key_ok;
/* initial-exec: no __tls_get_addr call per event. The shim is preloaded
 * (static TLS); a dlopen finds these 8 bytes in glibc's surplus. */
static __thread struct tbuf *tls_buf __attribute__((tls_model("initial-exec")));
static _Atomic uint64_t dropped;
static atomic_bool writer_started;

/* Guarded by buf_mu. */
static pthread_mutex_t buf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t buf_cv;
static struct tbuf *threads;     /* every thread's buffer */
static size_t nthreads;
static struct chunk *full_head, *full_tail, *free_list;
static unsigned free_count;
static bool closed;
static struct site *sites;      /* sites[id - 1] */
static uint32_t nsites, sites_cap;
static uint64_t *site_slots;    /* open addressing: key (nstack << 32 | pystack), 0 = empty */
static uint32_t *site_ids;
static uint32_t slots_cap;

/* Guarded by write_mu. */
static pthread_mutex_t write_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *g_file;
static int g_fd = -1;
static bool g_failed;
static uint32_t sites_written;
static size_t devices_written;
static uint8_t *nstack_seen;    /* bitmap by native stack id */
static size_t nstack_seen_bytes;
static uint32_t *nstacks;       /* native stack ids written, in order */
static size_t n_nstacks, nstacks_cap;
static uint64_t maps_hash;
struct span {                    /* part of a chunk to write */
    struct chunk *c;
    uint32_t end;
};
static struct span *spans;       /* the writer's snapshot of threads' chunks */
static size_t spans_cap;

/* Metadata being built for one write; writer only. */
struct meta {
    char *p;
    size_t len, cap;
    bool oom;
};

static uint64_t now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void meta_reserve(struct meta *m, size_t more)
{
    if (m->oom || m->len + more <= m->cap)
        return;
    size_t cap = m->cap ? m->cap : 4096;
    while (cap < m->len + more)
        cap *= 2;
    char *p = realloc(m->p, cap);
    if (!p) {
        m->oom = true;
        return;
    }
    m->p = p;
    m->cap = cap;
}

/* One record: tag, length, then the payload from the pieces, padded to 8. */
static void meta_add(struct meta *m, uint32_t tag, const void *a, size_t alen, const void *b,
                     size_t blen)
{
    size_t len = alen + blen, padded = (len + 7) & ~(size_t)7;
    meta_reserve(m, sizeof(trace_meta) + padded);
    if (m->oom)
        return;
    trace_meta h = {.tag = tag, .len = (uint32_t)len};
    memcpy(m->p + m->len, &h, sizeof h);
    m->len += sizeof h;
    if (alen)
        memcpy(m->p + m->len, a, alen);
    if (blen)
        memcpy(m->p + m->len + alen, b, blen);
    memset(m->p + m->len + len, 0, padded - len);
    m->len += padded;
}

/* ---- the site table (buf_mu held) ---- */

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static bool slots_grow(void)
{
    uint32_t cap = slots_cap ? slots_cap * 2 : 1024;
    uint64_t *slots = calloc(cap, sizeof *slots);
    uint32_t *ids = calloc(cap, sizeof *ids);
    if (!slots || !ids) {
        free(slots);
        free(ids);
        return false;
    }
    for (uint32_t i = 0; i < slots_cap; i++) {
        if (!site_slots[i])
            continue;
        uint32_t j = (uint32_t)mix(site_slots[i]) & (cap - 1);
        while (slots[j])
            j = (j + 1) & (cap - 1);
        slots[j] = site_slots[i];
        ids[j] = site_ids[i];
    }
    free(site_slots);
    free(site_ids);
    site_slots = slots;
    site_ids = ids;
    slots_cap = cap;
    return true;
}

static uint32_t site_intern(uint32_t nstack, uint32_t pystack)
{
    uint64_t key = (uint64_t)nstack << 32 | pystack;
    if (!key)
        return 0;
    if (slots_cap) {
        uint32_t j = (uint32_t)mix(key) & (slots_cap - 1);
        for (; site_slots[j]; j = (j + 1) & (slots_cap - 1))
            if (site_slots[j] == key)
                return site_ids[j];
    }
    if ((nsites + 1) * 2 > slots_cap && !slots_grow())
        return 0;
    if (nsites == sites_cap) {
        uint32_t cap = sites_cap ? sites_cap * 2 : 1024;
        struct site *s = realloc(sites, cap * sizeof *s);
        if (!s)
            return 0;
        sites = s;
        sites_cap = cap;
    }
    sites[nsites++] = (struct site){nstack, pystack};
    uint32_t j = (uint32_t)mix(key) & (slots_cap - 1);
    while (site_slots[j])
        j = (j + 1) & (slots_cap - 1);
    site_slots[j] = key;
    site_ids[j] = nsites;
    return nsites;
}

/* ---- buffers (buf_mu held) ---- */

/* A chunk from the free list, or NULL (buf_mu held). */
static struct chunk *chunk_reuse(void)
{
    struct chunk *c = free_list;
    if (c) {
        free_list = c->next;
        free_count--;
    }
    return c;
}

static void chunk_reset(struct chunk *c)
{
    c->next = NULL;
    atomic_store_explicit(&c->n, 0, memory_order_relaxed);
    atomic_store_explicit(&c->last_seq, 0, memory_order_relaxed);
    c->written = 0;
}

/* buf_mu held. */
static void queue_full(struct chunk *c)
{
    c->next = NULL;
    if (full_tail)
        full_tail->next = c;
    else
        full_head = c;
    full_tail = c;
}

static void *writer_main(void *arg);

static void start_writer(void)
{
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

static void tbuf_exit(void *arg);

void shim_tracefile_init(const char *path_template, unsigned flush_ms)
{
    if (!path_template || !path_template[0] || strlen(path_template) >= sizeof g_template)
        return;
    strcpy(g_template, path_template);
    g_flush_ms = flush_ms ? flush_ms : 1000;
    shim_cond_init_monotonic(&buf_cv);
    /* Without the key a thread's buffer outlives it: its events are still
     * written (the writer finds the buffer in the list), only the memory
     * stays. */
    g_key_ok = pthread_key_create(&g_key, tbuf_exit) == 0;
    g_start_mono = now_ns(CLOCK_MONOTONIC);
    g_start_real = now_ns(CLOCK_REALTIME);
    atomic_store(&g_on, true);
}

/* The calling thread's first event: its buffer, in the list the writer
 * reads. The chunk is allocated before buf_mu is taken. */
static struct tbuf *tbuf_new(void)
{
    struct tbuf *tb = calloc(1, sizeof *tb);
    struct chunk *c = malloc(sizeof *c);
    if (!tb || !c) {
        free(tb);
        free(c);
        return NULL;
    }
    chunk_reset(c);
    tb->cur = c;
    shim_mutex_lock(&buf_mu);
    tb->next = threads;
    if (threads)
        threads->prev = tb;
    threads = tb;
    nthreads++;
    shim_mutex_unlock(&buf_mu);
    tls_buf = tb;
    if (g_key_ok)
        pthread_setspecific(g_key, tb);
    if (!atomic_exchange(&writer_started, true))
        start_writer();
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
    struct chunk *c = tb->cur;
    if (c && atomic_load_explicit(&c->n, memory_order_relaxed) > c->written)
        queue_full(c);
    else
        free(c);
    shim_mutex_unlock(&buf_mu);
    free(tb);
}

/* The thread's chunk is full (or there is none): it goes to the writer,
 * and a fresh one replaces it. Returns NULL when there is no memory. */
static struct chunk *chunk_swap(struct tbuf *tb)
{
    shim_mutex_lock(&buf_mu);
    if (tb->cur)
        queue_full(tb->cur);
    /* Reset before it is published: the writer may look at it at once. */
    struct chunk *c = chunk_reuse();
    if (c)
        chunk_reset(c);
    tb->cur = c;
    shim_mutex_unlock(&buf_mu);
    pthread_cond_signal(&buf_cv);
    if (!c) {
        c = malloc(sizeof *c);
        if (!c)
            return NULL;
        chunk_reset(c);
        shim_mutex_lock(&buf_mu);
        tb->cur = c;
        shim_mutex_unlock(&buf_mu);
    }
    return c;
}

/* A pair this thread's cache does not have: the shared table (buf_mu). */
static uint32_t site_slow(struct tbuf *tb, unsigned slot, uint64_t key)
{
    shim_mutex_lock(&buf_mu);
    uint32_t id = site_intern((uint32_t)(key >> 32), (uint32_t)key);
    shim_mutex_unlock(&buf_mu);
    if (id) {
        tb->cache[slot].key = key;
        tb->cache[slot].site = id;
    }
    return id;
}

void shim_tracefile_append(unsigned kind, unsigned device, uint64_t seq, uint64_t addr,
                           uint64_t size, uint32_t native_stack, uint32_t python_stack)
{
    if (__builtin_expect(!atomic_load_explicit(&g_on, memory_order_relaxed), 0))
        return;
    struct tbuf *tb = tls_buf;
    if (__builtin_expect(!tb, 0) && !(tb = tbuf_new())) {
        atomic_fetch_add_explicit(&dropped, 1, memory_order_relaxed);
        return;
    }
    struct chunk *c = tb->cur;
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
    if (__builtin_expect(n + 1 == EV_PER_CHUNK, 0))
        chunk_swap(tb);
}

/* ---- the file (write_mu held) ---- */

static int write_all(const void *p, size_t n)
{
    const char *s = p;
    while (n) {
        ssize_t w = write(g_fd, s, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

static bool file_ready(void)
{
    if (g_fd >= 0)
        return true;
    if (g_failed)
        return false;
    char path[4096];
    if (shim_path_expand(g_template, path, sizeof path) != 0) {
        shim_warn("SPYRESHIM_TRACE: path too long; no trace recorded");
        goto fail;
    }
    /* The one safe-open policy: no symlink, no FIFO, never another user's file. */
    g_file = shim_path_open_write(path);
    if (!g_file) {
        shim_warn("SPYRESHIM_TRACE: cannot write %s: %s; no trace recorded", path,
                  errno == EPERM ? "it belongs to another user or has other links" : strerror(errno));
        goto fail;
    }
    g_fd = fileno(g_file);
    trace_header h = {.version = TRACE_VERSION, .pid = (uint32_t)getpid(),
                      .start_realtime_ns = g_start_real, .start_monotonic_ns = g_start_mono};
    memcpy(h.magic, TRACE_MAGIC, 8);
    if (write_all(&h, sizeof h) != 0) {
        shim_warn("SPYRESHIM_TRACE: writing %s failed: %s; no trace recorded", path, strerror(errno));
        fclose(g_file);
        g_file = NULL;
        g_fd = -1;
        goto fail;
    }
    return true;
fail:
    g_failed = true;
    atomic_store(&g_on, false);
    return false;
}

static bool nstack_mark(uint32_t id)
{
    size_t byte = id / 8;
    if (byte >= nstack_seen_bytes) {
        size_t n = nstack_seen_bytes ? nstack_seen_bytes : 1024;
        while (n <= byte)
            n *= 2;
        uint8_t *p = realloc(nstack_seen, n);
        if (!p)
            return false;
        memset(p + nstack_seen_bytes, 0, n - nstack_seen_bytes);
        nstack_seen = p;
        nstack_seen_bytes = n;
    }
    if (nstack_seen[byte] & (1u << (id % 8)))
        return false;
    if (n_nstacks == nstacks_cap) {
        size_t cap = nstacks_cap ? nstacks_cap * 2 : 1024;
        uint32_t *p = realloc(nstacks, cap * sizeof *p);
        if (!p)
            return false;
        nstacks = p;
        nstacks_cap = cap;
    }
    nstack_seen[byte] |= (uint8_t)(1u << (id % 8));
    nstacks[n_nstacks++] = id;
    return true;
}

/* The executable mappings, so that a reader can place raw addresses in
 * their objects when the process died before it could name them. Read
 * from /proc (no loader call: the writer runs at any time). Written again
 * only when they changed. */
static void add_maps(struct meta *m)
{
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len == cap) {
            char *p = realloc(buf, cap * 2);
            if (!p)
                break;
            buf = p;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (!buf)
        return;
    /* Keep the lines of executable mappings of files. */
    size_t out = 0;
    for (size_t i = 0; i < len;) {
        char *nl = memchr(buf + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - buf) + 1 : len;
        char *sp = memchr(buf + i, ' ', e - i);
        if (sp && (size_t)(sp - buf) + 3 < e && sp[3] == 'x' && memchr(buf + i, '/', e - i)) {
            memmove(buf + out, buf + i, e - i);
            out += e - i;
        }
        i = e;
    }
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < out; i++)
        h = (h ^ (uint8_t)buf[i]) * 1099511628211ULL;
    if (h != maps_hash) {
        maps_hash = h;
        meta_add(m, TRACE_META_MAPS, buf, out, NULL, 0);
    }
    free(buf);
}

/* Devices, sites and native stacks that events about to be written may
 * name and that the file does not have yet. */
static void add_new_meta(struct meta *m, const struct site *news, uint32_t first, uint32_t n)
{
    size_t ndev = shim_device_count();
    for (; devices_written < ndev; devices_written++) {
        uint32_t d[2] = {(uint32_t)devices_written, 0};
        const char *name = shim_device_name(shim_device_at(devices_written));
        meta_add(m, TRACE_META_DEVICE, d, sizeof d, name, strlen(name) + 1);
    }
    bool new_stacks = false;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t rec[4] = {first + i, news[i].nstack, news[i].pystack, 0};
        meta_add(m, TRACE_META_SITE, rec, sizeof rec, NULL, 0);
        if (news[i].nstack && nstack_mark(news[i].nstack)) {
            const uintptr_t *frames;
            size_t nf = shim_stack_frames(news[i].nstack, &frames);
            uint32_t head[2] = {news[i].nstack, (uint32_t)nf};
            uint64_t tmp[SHIM_STACK_MAX_DEPTH];
            for (size_t k = 0; k < nf && k < SHIM_STACK_MAX_DEPTH; k++)
                tmp[k] = frames[k];
            meta_add(m, TRACE_META_NSTACK, head, sizeof head, tmp, nf * sizeof tmp[0]);
            new_stacks = true;
        }
    }
    if (new_stacks)
        add_maps(m);
}

/* One chunk record of the file: events ev[0..n) (their smallest sequence
 * number is the record's base), then the metadata. `ref` is the whole
 * sequence number of one event of the chunk they come from. */
static void write_chunk(const trace_event *ev, uint32_t n, uint64_t ref, const struct meta *m)
{
    uint64_t base = UINT64_MAX;
    /* Events of one chunk lie within 2^31 sequence numbers of each other
     * (a flush interval's worth at most): each one's whole number is the
     * reference moved by the signed difference of the low bits. Not
     * computed while appending: it costs the allocating thread nothing. */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t s = ref + (uint64_t)(int64_t)(int32_t)(ev[i].seq_lo - (uint32_t)ref);
        if (s < base)
            base = s;
    }
    trace_chunk h = {.magic = TRACE_CHUNK_MAGIC, .nevents = n,
                     .meta_bytes = m ? (uint32_t)m->len : 0,
                     .seq_base = n ? base : 0};
    if (write_all(&h, sizeof h) != 0 || (n && write_all(ev, n * sizeof ev[0]) != 0) ||
        (m && m->len && write_all(m->p, m->len) != 0)) {
        shim_warn("SPYRESHIM_TRACE: write failed: %s; recording stops", strerror(errno));
        g_failed = true;
        atomic_store(&g_on, false);
    }
}

/* Writes every event published so far: the full chunks, then what each
 * thread's current chunk holds past what was written. write_mu held by the
 * caller. */
static void flush_locked(void)
{
    size_t nspans;
    for (;;) {
        shim_mutex_lock(&buf_mu);
        size_t need = nthreads;
        if (need <= spans_cap)
            break;
        shim_mutex_unlock(&buf_mu);
        size_t cap = spans_cap ? spans_cap : 16;
        while (cap < need)
            cap *= 2;
        struct span *p = realloc(spans, cap * sizeof *p);
        if (!p) {
            shim_mutex_lock(&buf_mu);  /* only the full chunks this time */
            need = 0;
            break;
        }
        spans = p;
        spans_cap = cap;
    }
    struct chunk *list = full_head;
    full_head = full_tail = NULL;
    nspans = 0;
    for (struct tbuf *tb = threads; tb && nspans < spans_cap; tb = tb->next) {
        struct chunk *c = tb->cur;
        if (!c)
            continue;
        /* Acquire: the events below n are complete, their sites interned. */
        uint32_t end = atomic_load_explicit(&c->n, memory_order_acquire);
        if (end > c->written)
            spans[nspans++] = (struct span){c, end};
    }
    uint32_t first = sites_written, n = nsites - sites_written;
    struct site *news = n ? malloc(n * sizeof *news) : NULL;
    if (news)
        memcpy(news, sites + first, n * sizeof *news);
    else
        n = 0;
    shim_mutex_unlock(&buf_mu);

    /* A chunk in the queue is no thread's any more: its count is final.
     * A thread's current chunk is written up to the snapshot; the thread
     * appends past it meanwhile, never below. */
    if ((list || nspans) && file_ready()) {
        struct meta m = {0};
        add_new_meta(&m, news, first + 1, n);
        if (!m.oom)
            sites_written = first + n;
        else
            m.len = 0;   /* these sites are written with the next chunk */
        bool meta_done = false;
        for (struct chunk *c = list; c && !g_failed; c = c->next) {
            uint32_t end = atomic_load_explicit(&c->n, memory_order_acquire);
            if (end <= c->written)
                continue;
            write_chunk(c->ev + c->written, end - c->written,
                        atomic_load_explicit(&c->last_seq, memory_order_relaxed),
                        meta_done ? NULL : &m);
            meta_done = true;
            c->written = end;
        }
        for (size_t i = 0; i < nspans && !g_failed; i++) {
            struct chunk *c = spans[i].c;
            write_chunk(c->ev + c->written, spans[i].end - c->written,
                        atomic_load_explicit(&c->last_seq, memory_order_relaxed),
                        meta_done ? NULL : &m);
            meta_done = true;
            c->written = spans[i].end;
        }
        if (!meta_done && m.len && !g_failed)
            write_chunk(NULL, 0, 0, &m);
        free(m.p);
    }
    free(news);
    if (!list)
        return;
    shim_mutex_lock(&buf_mu);
    while (list) {
        struct chunk *next = list->next;
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

static void *writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec deadline;
        shim_deadline_after_ms(&deadline, g_flush_ms);
        shim_mutex_lock(&buf_mu);
        while (!full_head && !closed &&
               pthread_cond_timedwait(&buf_cv, &buf_mu, &deadline) != ETIMEDOUT)
            ;
        bool stop = closed;
        shim_mutex_unlock(&buf_mu);
        if (stop)
            return NULL;
        shim_mutex_lock(&write_mu);
        flush_locked();
        shim_mutex_unlock(&write_mu);
    }
}

/* ---- at exit: names ---- */

struct addr_set {
    uintptr_t *slots;
    size_t cap, n;
};

static bool addr_insert(struct addr_set *s, uintptr_t a)
{
    if ((s->n + 1) * 2 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        uintptr_t *slots = calloc(cap, sizeof *slots);
        if (!slots)
            return false;
        for (size_t i = 0; i < s->cap; i++) {
            if (!s->slots[i])
                continue;
            size_t j = mix(s->slots[i]) & (cap - 1);
            while (slots[j])
                j = (j + 1) & (cap - 1);
            slots[j] = s->slots[i];
        }
        free(s->slots);
        s->slots = slots;
        s->cap = cap;
    }
    size_t j = mix(a) & (s->cap - 1);
    for (; s->slots[j]; j = (j + 1) & (s->cap - 1))
        if (s->slots[j] == a)
            return false;
    s->slots[j] = a;
    s->n++;
    return true;
}

static void add_symbol(struct meta *m, shim_symbolizer *sym, uintptr_t a)
{
    shim_symbol s = {0};
    shim_symbolize(sym, a, &s);
    const char *fn = s.function ? s.function : "";
    const char *file = s.file ? s.file : "";
    const char *obj = s.object ? s.object : "";
    size_t lf = strlen(fn) + 1, lfile = strlen(file) + 1, lo = strlen(obj) + 1;
    char *str = malloc(lf + lfile + lo);
    if (!str)
        return;
    memcpy(str, fn, lf);
    memcpy(str + lf, file, lfile);
    memcpy(str + lf + lfile, obj, lo);
    struct {
        uint64_t addr;
        int32_t line;
        uint32_t zero;
    } head = {a, s.line, 0};
    meta_add(m, TRACE_META_SYMBOL, &head, sizeof head, str, lf + lfile + lo);
    free(str);
}

static void add_pystack(struct meta *m, uint32_t id)
{
    shim_pyframe fr[PYSTACK_MAX_FRAMES];
    size_t n = shim_pystack_frames(id, fr, PYSTACK_MAX_FRAMES);
    if (n > PYSTACK_MAX_FRAMES)
        n = PYSTACK_MAX_FRAMES;
    struct meta body = {0};
    for (size_t i = 0; i < n; i++) {
        const char *fn = fr[i].function ? fr[i].function : "<unknown>";
        const char *file = fr[i].file ? fr[i].file : "";
        size_t lf = strlen(fn) + 1, lfile = strlen(file) + 1;
        meta_reserve(&body, 4 + lf + lfile);
        if (body.oom)
            break;
        int32_t line = fr[i].line;
        memcpy(body.p + body.len, &line, 4);
        memcpy(body.p + body.len + 4, fn, lf);
        memcpy(body.p + body.len + 4 + lf, file, lfile);
        body.len += 4 + lf + lfile;
    }
    if (!body.oom) {
        uint32_t head[2] = {id, (uint32_t)n};
        meta_add(m, TRACE_META_PYSTACK, head, sizeof head, body.p, body.len);
    }
    free(body.p);
}

static void add_names(struct meta *m)
{
    shim_symbolizer *sym = shim_symbolizer_create();
    struct addr_set seen = {0};
    for (size_t i = 0; sym && i < n_nstacks; i++) {
        const uintptr_t *frames;
        size_t nf = shim_stack_frames(nstacks[i], &frames);
        for (size_t k = 0; k < nf; k++)
            if (frames[k] && addr_insert(&seen, frames[k]))
                add_symbol(m, sym, frames[k]);
    }
    free(seen.slots);
    if (sym)
        shim_symbolizer_destroy(sym);
    /* Python stacks were resolved while the interpreter was alive. */
    struct addr_set py = {0};
    shim_mutex_lock(&buf_mu);
    uint32_t n = nsites;
    shim_mutex_unlock(&buf_mu);
    for (uint32_t i = 0; i < n; i++)
        if (sites[i].pystack && addr_insert(&py, sites[i].pystack))
            add_pystack(m, sites[i].pystack);
    free(py.slots);
}

void shim_tracefile_close(void)
{
    if (!g_template[0])
        return;
    /* Appends stop here; one already past the check may still land in its
     * chunk and be written below, or be lost, as if it came after. */
    atomic_store(&g_on, false);
    shim_mutex_lock(&write_mu);
    shim_mutex_lock(&buf_mu);
    bool was_closed = closed, any = atomic_load(&writer_started);
    closed = true;
    uint64_t lost = atomic_load(&dropped);
    shim_mutex_unlock(&buf_mu);
    pthread_cond_broadcast(&buf_cv);
    if (!was_closed && any) {
        flush_locked();
        if (g_fd >= 0 && !g_failed) {
            /* Names come from the loader (symbolization): never with a
             * lock of ours held (docs/locking.md). `closed` keeps every
             * other writer out meanwhile. */
            shim_mutex_unlock(&write_mu);
            struct meta m = {0};
            add_names(&m);
            shim_mutex_lock(&write_mu);
            if (!m.oom && g_fd >= 0 && !g_failed)
                write_chunk(NULL, 0, 0, &m);
            free(m.p);
        }
        if (lost)
            shim_warn("SPYRESHIM_TRACE: %llu events were not recorded (out of host memory)",
                      (unsigned long long)lost);
    }
    if (g_file) {
        fclose(g_file);
        g_file = NULL;
        g_fd = -1;
    }
    atomic_store(&g_on, false);
    shim_mutex_unlock(&write_mu);
}

/* ---- fork ---- */

void shim_tracefile_atfork_prepare(void)
{
    shim_mutex_lock(&write_mu);
    shim_mutex_lock(&buf_mu);
}

void shim_tracefile_atfork_parent(void)
{
    shim_mutex_unlock(&buf_mu);
    shim_mutex_unlock(&write_mu);
}

void shim_tracefile_atfork_child(void)
{
    /* The parent writes what it buffered; the child starts a file of its
     * own (the sites table is kept: ids stay valid, and every site and
     * stack is written again to the new file). Every buffer is the
     * parent's: the other threads do not exist here, and the forking
     * thread's events are the parent's too. They are all dropped; this
     * thread starts a new buffer, and with it the writer thread (none
     * exists here), with its next event. */
    struct chunk *c = full_head;
    while (c) {
        struct chunk *next = c->next;
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
    tls_buf = NULL;
    if (g_key_ok)
        pthread_setspecific(g_key, NULL);
    atomic_store(&writer_started, false);
    sites_written = 0;
    devices_written = 0;
    n_nstacks = 0;
    if (nstack_seen)
        memset(nstack_seen, 0, nstack_seen_bytes);
    maps_hash = 0;
    if (g_file) {
        /* The parent's descriptor: closed here, never written. */
        fclose(g_file);
        g_file = NULL;
        g_fd = -1;
    }
    if (!strstr(g_template, "%p"))
        atomic_store(&g_on, false); /* one file, the parent's */
    shim_cond_init_monotonic(&buf_cv);
    shim_mutex_unlock(&buf_mu);
    shim_mutex_unlock(&write_mu);
}
