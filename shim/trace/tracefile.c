/* The trace file (tracefile.h; the layout is tracefmt.h and
 * docs/trace-format.md).
 *
 * Owns: the path template, the open file (a descriptor of the shim's own:
 * kept high and checked before each record, opened again at its path when
 * the program closed it: shim/base/ownfd.c), and what the file has been
 * given so far (sites, native stacks, devices, the module map), so that
 * each is written once per file, before the first event that names it.
 *
 * Guarded by the trace write lock (`write_mu`, tracewriter.c), held by the
 * caller of every function here but init: the writer thread, the
 * destructor, the fork handlers. Never runs on an allocating thread, never
 * calls into the allocator or Python. Opening is shim/base/path.c's
 * safe-open policy (no symlink, no FIFO, never another user's file), with
 * an flock(2) held while the file is open: one writing process per file
 * (a second one, or an exec'd image, writes PATH.2). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device.h"
#include "log.h"
#include "ownfd.h"
#include "passthrough.h"
#include "path.h"
#include "rank.h"
#include "stack.h"
#include "tracebuf.h"
#include "tracecodec.h"
#include "tracefile.h"
#include "tracesites.h"

static char g_template[4096];    /* written once by init */
static bool g_has_pid;           /* it has a %p escape (path.c's one parser) */
static char g_path[4096];        /* the file opened, for opening it again */
static struct shim_ownfd g_own = SHIM_OWNFD_NONE;
static uint64_t g_good;          /* bytes of whole records in the file */
static uint64_t g_events;        /* events in them */
static bool g_failed;
static bool g_opened;            /* this process opened a file (g_path) */
static uint32_t sites_written;
static size_t devices_written;
static bool families_written; /* the pass-through families' device records */
static bool process_written;  /* the launcher's identity (TRACE_META_PROCESS) */
static bool capacity_written[SHIM_MAX_DEVICES]; /* TRACE_META_CAPACITY, once known */
static uint8_t *nstack_seen;    /* bitmap by native stack id */
static size_t nstack_seen_bytes;
static uint32_t *nstacks;       /* native stack ids written, in order */
static size_t n_nstacks, nstacks_cap;
static uint64_t maps_hash;

bool shim_tracefile_init(const char *path_template)
{
    if (!path_template || !path_template[0])
        return false;
    if (strlen(path_template) >= sizeof g_template) {
        shim_warn("SPYRESHIM_TRACE: the path is %zu bytes, longer than the %zu a path may have; "
                  "no trace recorded", strlen(path_template), sizeof g_template - 1);
        return false;
    }
    strcpy(g_template, path_template);
    g_has_pid = shim_path_has_pid(g_template);
    return true;
}

/* ---- metadata records ---- */

void shim_tracefile_meta_reserve(struct trace_meta_buf *m, size_t more)
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

void shim_tracefile_meta_add(struct trace_meta_buf *m, uint32_t tag, const void *a, size_t alen,
                             const void *b, size_t blen)
{
    size_t len = alen + blen, padded = (len + 7) & ~(size_t)7;
    shim_tracefile_meta_reserve(m, sizeof(trace_meta) + padded);
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

size_t shim_tracefile_native_stacks(const uint32_t **ids)
{
    *ids = nstacks;
    return n_nstacks;
}

/* The executable mappings, so that a reader can place raw addresses in
 * their objects when the process died before it could name them. Read
 * from /proc (no loader call: the writer runs at any time). Written again
 * only when they changed. */
static void add_maps(struct trace_meta_buf *m)
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
        shim_tracefile_meta_add(m, TRACE_META_MAPS, buf, out, NULL, 0);
    }
    free(buf);
}

/* Which rank of which launch wrote the file (rank.c), so that a reader of
 * several files can tell them apart without their names: key\0value\0
 * pairs, only the values a launcher set (the host always). */
static void add_process(struct trace_meta_buf *m)
{
    const shim_rank *id = shim_rank_get();
    const struct { const char *key, *value; } kv[] = {
        {"rank", id->rank}, {"local_rank", id->local_rank}, {"world_size", id->world_size},
        {"restart", id->restart}, {"run_id", id->run_id}, {"host", id->host},
    };
    char buf[512];
    size_t len = 0;
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        if (!kv[i].value)
            continue;
        size_t k = strlen(kv[i].key) + 1, v = strlen(kv[i].value) + 1;
        if (len + k + v > sizeof buf)
            break;
        memcpy(buf + len, kv[i].key, k);
        memcpy(buf + len + k, kv[i].value, v);
        len += k + v;
    }
    shim_tracefile_meta_add(m, TRACE_META_PROCESS, buf, len, NULL, 0);
}

void shim_tracefile_meta_new(struct trace_meta_buf *m)
{
    if (!process_written)
        add_process(m);
    uint32_t n;
    struct trace_site *news = shim_tracesites_since(sites_written, &n);
    uint32_t first = sites_written + 1;
    size_t ndev = shim_device_count();
    for (; devices_written < ndev; devices_written++) {
        uint32_t d[2] = {(uint32_t)devices_written, 0};
        const char *name = shim_device_name(shim_device_at(devices_written));
        shim_tracefile_meta_add(m, TRACE_META_DEVICE, d, sizeof d, name, strlen(name) + 1);
    }
    for (size_t i = 0; i < ndev && i < SHIM_MAX_DEVICES; i++) {
        uint64_t cap = capacity_written[i] ? 0 : shim_device_capacity(shim_device_at(i));
        if (cap) {
            uint32_t d[2] = {(uint32_t)i, 0};
            shim_tracefile_meta_add(m, TRACE_META_CAPACITY, d, sizeof d, &cap, sizeof cap);
            capacity_written[i] = !m->oom;
        }
    }
    /* The pass-through families' pseudo-devices, named once when any
     * such memory was seen. */
    if (!families_written && shim_passthrough_used()) {
        families_written = true;
        static const struct { uint32_t dev; enum shim_pt_family f; } fam[] = {
            {TRACE_DEVICE_MANAGED, SHIM_PT_MANAGED},
            {TRACE_DEVICE_HOST_PINNED, SHIM_PT_HOST_PINNED},
            {TRACE_DEVICE_VMM, SHIM_PT_VMM},
            {TRACE_DEVICE_ASYNC, SHIM_PT_ASYNC},
            {TRACE_DEVICE_OPENCL_MEM, SHIM_PT_OPENCL_MEM},
            {TRACE_DEVICE_OPENCL_SVM, SHIM_PT_OPENCL_SVM},
        };
        for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++) {
            uint32_t d[2] = {fam[i].dev, 0};
            const char *name = shim_passthrough_family_name(fam[i].f);
            shim_tracefile_meta_add(m, TRACE_META_DEVICE, d, sizeof d, name, strlen(name) + 1);
        }
    }
    bool new_stacks = false;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t rec[4] = {first + i, news[i].nstack, news[i].pystack, 0};
        shim_tracefile_meta_add(m, TRACE_META_SITE, rec, sizeof rec, NULL, 0);
        if (news[i].nstack && nstack_mark(news[i].nstack)) {
            const uintptr_t *frames;
            size_t nf = shim_stack_frames(news[i].nstack, &frames);
            uint32_t head[2] = {news[i].nstack, (uint32_t)nf};
            uint64_t tmp[SHIM_STACK_MAX_DEPTH];
            for (size_t k = 0; k < nf && k < SHIM_STACK_MAX_DEPTH; k++)
                tmp[k] = frames[k];
            shim_tracefile_meta_add(m, TRACE_META_NSTACK, head, sizeof head, tmp,
                                    nf * sizeof tmp[0]);
            new_stacks = true;
        }
    }
    if (new_stacks)
        add_maps(m);
    free(news);
    if (!m->oom) {
        sites_written = first - 1 + n;
        process_written = true;
    } else {
        m->len = 0;   /* these sites are written with the next chunk */
    }
}

/* ---- the file ---- */

/* Whether the file open at fd is a trace that an earlier image of this
 * process wrote before it exec'd (same pid, begun since this process
 * started): never truncated. A trace of an old process that had our pid
 * began before we started. */
static bool earlier_image(int fd)
{
    trace_header h;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || memcmp(h.magic, TRACE_MAGIC, 8) != 0 ||
        h.pid != (uint32_t)getpid())
        return false;
    /* A clock tick of slack: /proc counts the start in ticks. */
    uint64_t started = shim_path_process_start_ns(), slack = 50000000u;
    return started == 0 || h.start_realtime_ns + slack >= started;
}

/* PATH with ".N" before its extension (same.trace: same.2.trace). */
static int numbered(const char *path, unsigned n, char *out, size_t size)
{
    const char *slash = strrchr(path, '/');
    const char *dot = strrchr(slash ? slash + 1 : path, '.');
    if (!dot || dot == (slash ? slash + 1 : path))
        dot = path + strlen(path);
    int k = snprintf(out, size, "%.*s.%u%s", (int)(dot - path), path, n, dot);
    return k < 0 || (size_t)k >= size ? -1 : 0;
}

/* Opens the trace: `path`, or when another process holds it or it is this
 * process's trace from before an exec, the first of PATH.2, PATH.3, ...
 * that is neither (said in one line). The chosen name is left in
 * g_path. -1 with errno set. */
static int open_trace(const char *path)
{
    const char *taken = NULL;
    for (unsigned n = 1; n < 100; n++) {
        if (n == 1)
            snprintf(g_path, sizeof g_path, "%s", path);
        else if (numbered(path, n, g_path, sizeof g_path) != 0) {
            errno = ENAMETOOLONG;
            return -1;
        }
        /* Locked first, then looked at, then truncated: a file another
         * process is writing, or an earlier image wrote, is left whole. */
        int fd = shim_path_open_write_fd(g_path, SHIM_PATH_LOCK | SHIM_PATH_KEEP);
        if (fd < 0 && errno != EBUSY)
            return -1;
        if (fd >= 0 && earlier_image(fd)) {
            close(fd);
            fd = -1;
            if (n == 1)
                taken = "holds this process's trace from before it exec'd";
        } else if (fd < 0 && n == 1) {
            taken = "is being written by another process (it holds the file's lock)";
        }
        if (fd < 0)
            continue;
        if (ftruncate(fd, 0) != 0) {
            int err = errno;
            close(fd);
            errno = err;
            return -1;
        }
        if (taken)
            shim_warn("SPYRESHIM_TRACE: %s %s; this process (pid %ld) writes %s", path, taken,
                      (long)getpid(), g_path);
        return fd;
    }
    errno = EBUSY;
    return -1;
}

static int write_all(const void *p, size_t n)
{
    const char *s = p;
    while (n) {
        ssize_t w = write(g_own.fd, s, n);
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

static void stop(void)
{
    g_failed = true;
    shim_tracebuf_stop();
}

/* Whether our descriptor still names the trace, checked before each
 * record. A program that closed it (close-fds code) may have a file of its
 * own at that number now: the number is never written again; the trace is
 * opened again at its path, for appending, and a record the close cut is
 * trimmed. Stops, with one line, when the file at the path is not ours. */
static bool still_ours(void)
{
    if (shim_ownfd_is_ours(&g_own))
        return true;
    int old = g_own.fd;
    g_own.fd = -1;  /* the program's number now: never closed, never written */
    int fd = shim_path_reopen_append(g_path, g_own.dev, g_own.ino);
    if (fd >= 0 && ftruncate(fd, (off_t)g_good) != 0) {
        int err = errno;
        close(fd);   /* ours: just opened */
        fd = -1;
        errno = err;
    }
    /* shim_ownfd_take closes fd itself when it fails. */
    if (fd < 0 || shim_ownfd_take(&g_own, fd) != 0) {
        shim_warn("SPYRESHIM_TRACE: the program closed the trace's descriptor (%d) and %s cannot "
                  "be opened again (%s); recording stops: the trace ends at its last flush", old,
                  g_path, shim_path_why(errno));
        return false;
    }
    shim_debug("trace: the program closed the trace's descriptor (%d); %s opened again as %d",
               old, g_path, g_own.fd);
    return true;
}

/* One record, its pieces written in order, or nothing more of it: a
 * descriptor closed under us gets the record again on the reopened file. */
static int write_record(const void *a, size_t alen, const void *b, size_t blen, const void *c,
                        size_t clen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!still_ours())
            return -1;
        if (write_all(a, alen) == 0 && (!blen || write_all(b, blen) == 0) &&
            (!clen || write_all(c, clen) == 0)) {
            g_good += alen + blen + clen;
            return 0;
        }
        if (errno != EBADF)
            break;
    }
    return -1;
}

/* One state record, a chunk of its own: the reader knows from it whether
 * the file reached its process's exit. */
static void write_state(uint32_t state, uint32_t value)
{
    struct trace_meta_buf m = {0};
    uint32_t rec[2] = {state, value};
    shim_tracefile_meta_add(&m, TRACE_META_STATE, rec, sizeof rec, NULL, 0);
    if (!m.oom)
        shim_tracefile_write_chunk(NULL, 0, 0, 0, false, &m);
    free(m.p);
}

bool shim_tracefile_failed(void)
{
    return g_failed;
}

bool shim_tracefile_writable(void)
{
    return g_own.fd >= 0 && !g_failed;
}

bool shim_tracefile_ready(void)
{
    if (g_own.fd >= 0)
        return !g_failed;
    if (g_failed)
        return false;
    char path[4096];
    if (shim_path_expand(g_template, path, sizeof path) != 0) {
        shim_warn("SPYRESHIM_TRACE: the path is longer than %zu bytes once expanded; no trace "
                  "recorded", sizeof path - 1);
        stop();
        return false;
    }
    /* The one safe-open policy (no symlink, no FIFO, never another user's
     * file), locked for as long as it is open: one writer per file. */
    int fd = open_trace(path);
    if (fd < 0 || shim_ownfd_take(&g_own, fd) != 0) {
        shim_warn("SPYRESHIM_TRACE: cannot write %s: %s; no trace recorded", g_path,
                  shim_path_why(errno));
        stop();
        return false;
    }
    g_good = 0;
    g_events = 0;
    trace_header h = {.version = TRACE_VERSION, .pid = (uint32_t)getpid(),
                      .start_realtime_ns = shim_tracebuf_start_realtime_ns(),
                      .start_monotonic_ns = shim_tracebuf_start_monotonic_ns()};
    memcpy(h.magic, TRACE_MAGIC, 8);
    if (write_record(&h, sizeof h, NULL, 0, NULL, 0) != 0) {
        shim_warn("SPYRESHIM_TRACE: writing %s failed: %s; no trace recorded", g_path,
                  strerror(errno));
        shim_ownfd_close(&g_own);
        stop();
        return false;
    }
    g_opened = true;
    write_state(TRACE_STATE_RECORDING, 0);
    return !g_failed;
}

void shim_tracefile_end(void)
{
    if (shim_tracefile_writable())
        write_state(TRACE_STATE_ENDED, 0);
}

void shim_tracefile_end_by_signal(int sig)
{
    if (!shim_tracefile_writable())
        return;
    write_state(TRACE_STATE_SIGNALLED, (uint32_t)sig);
    /* The last record: the process ends now, and a record begun after
     * this one would be cut by its end. */
    g_failed = true;
    shim_tracebuf_stop();
}

uint32_t shim_tracefile_sites(void)
{
    return sites_written;
}

void shim_tracefile_write_chunk(const trace_event *ev, uint32_t n, uint64_t ref, uint32_t thread,
                                bool compress, const struct trace_meta_buf *m)
{
    /* A record holds at most a buffer's chunk (the codec's scratch); the
     * writer never passes more, but a longer run is split, not cut. */
    do {
        uint32_t k = n < TRACE_EV_PER_CHUNK ? n : TRACE_EV_PER_CHUNK;
        struct trace_encoded enc;
        /* Encoded on this thread (the writer's), never while appending:
         * the allocating threads' cost stays a 32-byte store. */
        shim_tracecodec_encode(ev, k, ref, compress, &enc);
        trace_chunk h = {.magic = TRACE_CHUNK_MAGIC, .nevents = k,
                         .meta_bytes = m ? (uint32_t)m->len : 0, .body_bytes = enc.body_bytes,
                         .seq_base = enc.seq_base, .thread = k ? thread : 0, .flags = enc.flags};
        if (write_record(&h, sizeof h, enc.body, enc.body_bytes, m ? m->p : NULL,
                         m ? m->len : 0) != 0) {
            if (g_own.fd >= 0) {  /* else still_ours said why */
                /* A full disk took part of the record: the file is cut
                 * back to its last whole one, which a reader reads as the
                 * end (the cut also gives back the space it held). */
                int err = errno;
                bool cut = ftruncate(g_own.fd, (off_t)g_good) == 0;
                shim_warn("SPYRESHIM_TRACE: writing %s failed: %s; recording stops: the trace "
                          "ends after %llu events (%llu bytes%s)", g_path, strerror(err),
                          (unsigned long long)g_events, (unsigned long long)g_good,
                          cut ? "" : ", then part of a record");
            }
            stop();
            return;
        }
        g_events += k;
        m = NULL;
        ev += k;
        n -= k;
    } while (n);
}

void shim_tracefile_close(void)
{
    shim_ownfd_close(&g_own);
}

bool shim_tracefile_written(char *path, size_t n, uint64_t *events)
{
    if (!g_opened)
        return false;
    snprintf(path, n, "%s", g_path);
    *events = g_events;
    return true;
}

void shim_tracefile_atfork_child(void)
{
    /* The sites table is kept (ids stay valid): every site and stack is
     * written again to the child's file. */
    sites_written = 0;
    devices_written = 0;
    families_written = false;
    process_written = false;
    memset(capacity_written, 0, sizeof capacity_written);
    n_nstacks = 0;
    if (nstack_seen)
        memset(nstack_seen, 0, nstack_seen_bytes);
    maps_hash = 0;
    g_opened = false;
    /* The parent's descriptor: closed here (when it still is the trace),
     * never written. */
    shim_ownfd_close(&g_own);
    if (!g_has_pid)
        shim_tracebuf_stop(); /* one file, the parent's */
}
