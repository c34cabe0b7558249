/* The trace file (tracefile.h; the layout is tracefmt.h and
 * docs/trace-format.md).
 *
 * Owns: the event buffers (chunks of 32768 events, 1 MiB), the table of
 * sites (a site is a (native stack, Python stack) pair, interned so that an
 * event carries one 32-bit id), the writer thread, and the file.
 *
 * Locks (docs/locking.md): `buf_mu` guards the current chunk, the queue of
 * full chunks, the free list and the site table. It is a leaf: appending
 * takes it for a copy of 32 bytes and a hash lookup, and it may be taken
 * with an allocator lock held (markers of a pressure event, allocations by
 * a callback that holds the lock) or the GIL (collection markers). `write_mu`
 * guards the file and what has been written to it (sites, stacks,
 * devices); it is held across the file's I/O and taken before `buf_mu`.
 * Never does I/O with `buf_mu` held, never does I/O on the allocating
 * thread: the writer thread (or the destructor) writes. Never calls into
 * the allocator or Python.
 *
 * Crash safety: the writer thread flushes every SPYRESHIM_TRACE_FLUSH_MS
 * (at most a second) and whenever a chunk fills, so a SIGKILL loses at
 * most that much; a chunk cut by the kill is dropped by the reader. */
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

#include "device.h"
#include "log.h"
#include "mutex.h"
#include "path.h"
#include "pystack.h"
#include "stack.h"
#include "symbolize.h"
#include "tracefile.h"
#include "tracefmt.h"

#define EV_PER_CHUNK 32768
#define FREE_CHUNKS_KEPT 4
#define PYSTACK_MAX_FRAMES 256

struct chunk {
    struct chunk *next;
    uint32_t n;
    uint64_t seq_min;
    trace_event ev[EV_PER_CHUNK];
};

struct site {
    uint32_t nstack, pystack;
};

/* Configuration, written once by shim_tracefile_init. */
static char g_template[4096];
static unsigned g_flush_ms = 1000;
static uint64_t g_start_mono, g_start_real;
static atomic_bool g_on;

/* Guarded by buf_mu. */
static pthread_mutex_t buf_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t buf_cv;
static struct chunk *cur, *full_head, *full_tail, *free_list;
static unsigned free_count;
static bool closed, writer_started;
static uint64_t dropped;
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

static struct chunk *chunk_get(void)
{
    struct chunk *c = free_list;
    if (c) {
        free_list = c->next;
        free_count--;
    } else {
        c = malloc(sizeof *c);
        if (!c)
            return NULL;
    }
    c->next = NULL;
    c->n = 0;
    c->seq_min = UINT64_MAX;
    return c;
}

static void chunk_put(struct chunk *c)
{
    if (free_count >= FREE_CHUNKS_KEPT) {
        free(c);
        return;
    }
    c->next = free_list;
    free_list = c;
    free_count++;
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

void shim_tracefile_init(const char *path_template, unsigned flush_ms)
{
    if (!path_template || !path_template[0] || strlen(path_template) >= sizeof g_template)
        return;
    strcpy(g_template, path_template);
    g_flush_ms = flush_ms ? flush_ms : 1000;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&buf_cv, &ca);
    pthread_condattr_destroy(&ca);
    g_start_mono = now_ns(CLOCK_MONOTONIC);
    g_start_real = now_ns(CLOCK_REALTIME);
    atomic_store(&g_on, true);
}

void shim_tracefile_append(unsigned kind, unsigned device, uint64_t seq, uint64_t addr,
                           uint64_t size, uint32_t native_stack, uint32_t python_stack)
{
    if (!atomic_load_explicit(&g_on, memory_order_relaxed))
        return;
    uint64_t t = now_ns(CLOCK_MONOTONIC) - g_start_mono;
    shim_mutex_lock(&buf_mu);
    if (closed) {
        shim_mutex_unlock(&buf_mu);
        return;
    }
    if (!cur)
        cur = chunk_get();
    if (!cur) {
        dropped++;
        shim_mutex_unlock(&buf_mu);
        return;
    }
    struct chunk *c = cur;
    c->ev[c->n++] = (trace_event){
        .addr = addr,
        .size_kind_dev = (size & TRACE_SIZE_MASK) | (uint64_t)(kind & 0xff) << 48 |
                         (uint64_t)(device & 0xff) << 56,
        .time_ns = t,
        .seq_lo = (uint32_t)seq,
        .site = site_intern(native_stack, python_stack),
    };
    if (seq < c->seq_min)
        c->seq_min = seq;
    bool wake = false;
    if (c->n == EV_PER_CHUNK) {
        if (full_tail)
            full_tail->next = c;
        else
            full_head = c;
        full_tail = c;
        cur = NULL;
        wake = true;
    }
    bool start = !writer_started;
    writer_started = true;
    shim_mutex_unlock(&buf_mu);
    if (wake)
        pthread_cond_signal(&buf_cv);
    if (start)
        start_writer();
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

static void write_chunk(struct chunk *c, const struct meta *m)
{
    uint32_t n = c ? c->n : 0;
    trace_chunk h = {.magic = TRACE_CHUNK_MAGIC, .nevents = n,
                     .meta_bytes = m ? (uint32_t)m->len : 0,
                     .seq_base = c && n ? c->seq_min : 0};
    if (write_all(&h, sizeof h) != 0 || (n && write_all(c->ev, n * sizeof c->ev[0]) != 0) ||
        (m && m->len && write_all(m->p, m->len) != 0)) {
        shim_warn("SPYRESHIM_TRACE: write failed: %s; recording stops", strerror(errno));
        g_failed = true;
        atomic_store(&g_on, false);
    }
}

/* Writes every buffered event. write_mu held by the caller. */
static void flush_locked(void)
{
    shim_mutex_lock(&buf_mu);
    struct chunk *list = full_head;
    full_head = full_tail = NULL;
    if (cur && cur->n) {
        if (list) {
            struct chunk *t = list;
            while (t->next)
                t = t->next;
            t->next = cur;
        } else {
            list = cur;
        }
        cur = NULL;
    }
    uint32_t first = sites_written, n = nsites - sites_written;
    struct site *news = n ? malloc(n * sizeof *news) : NULL;
    if (news)
        memcpy(news, sites + first, n * sizeof *news);
    else
        n = 0;
    shim_mutex_unlock(&buf_mu);

    if (list && file_ready()) {
        struct meta m = {0};
        add_new_meta(&m, news, first + 1, n);
        if (!m.oom) {
            sites_written = first + n;
        } else {
            m.len = 0;   /* these sites are written with the next chunk */
        }
        for (struct chunk *c = list; c && !g_failed; c = c->next)
            write_chunk(c, c == list ? &m : NULL);
        free(m.p);
    }
    free(news);
    shim_mutex_lock(&buf_mu);
    while (list) {
        struct chunk *next = list->next;
        chunk_put(list);
        list = next;
    }
    shim_mutex_unlock(&buf_mu);
}

static void *writer_main(void *arg)
{
    (void)arg;
    for (;;) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        deadline.tv_sec += g_flush_ms / 1000;
        deadline.tv_nsec += (long)(g_flush_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
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
    shim_mutex_lock(&write_mu);
    shim_mutex_lock(&buf_mu);
    bool was_closed = closed, any = writer_started;
    closed = true;
    uint64_t lost = dropped;
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
                write_chunk(NULL, &m);
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
     * stack is written again to the new file). No writer thread exists
     * here: it starts again with the next event. */
    struct chunk *c = full_head;
    while (c) {
        struct chunk *next = c->next;
        free(c);
        c = next;
    }
    full_head = full_tail = NULL;
    if (cur)
        cur->n = 0, cur->seq_min = UINT64_MAX;
    writer_started = false;
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
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&buf_cv, &ca);
    pthread_condattr_destroy(&ca);
    shim_mutex_unlock(&buf_mu);
    shim_mutex_unlock(&write_mu);
}
