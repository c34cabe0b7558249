/* The events of a version 2 chunk record (tracecodec.h; the layout is
 * tracefmt.h and docs/trace-format.md).
 *
 * Why this encoding: the reader is Python, and must decode at C speed with
 * the standard library alone. Byte planes are put back together by strided
 * slice assignment and zlib inflates in C; a plane that holds one byte
 * throughout (a device index, the high bytes of every address, time and
 * sequence number) costs one byte a chunk. Deltas (as memray writes them)
 * would need a running sum per event on the reader's side
 * (itertools.accumulate: a Python integer per event, 100 to 300 ns), and
 * zlib already finds what they would: addresses and sizes that recur
 * compress better as they are (docs/trace-format.md has the figures).
 *
 * Owns: the scratch buffers of one chunk's body and the zlib stream, both
 * guarded by the trace write lock (its caller holds it: tracefile.c).
 * zlib is dlopen'ed (a private helper, like libunwind and libdw: a process
 * that records no trace never loads it), with no lock of ours held. Never
 * runs on an allocating thread; never calls into the allocator or Python;
 * a failure to compress stores the chunk uncompressed, never drops it. */
#include <pthread.h>
#include <string.h>
#include <zlib.h>

#include "loader.h"
#include "log.h"
#include "tracebuf.h"
#include "tracecodec.h"

/* zlib's entry points, by dlsym on its own handle: never another copy the
 * program may carry. */
#define ZLIB_FUNCTIONS(X)                                                               \
    X(deflateInit2_, int, (z_streamp, int, int, int, int, int, const char *, int))      \
    X(deflate, int, (z_streamp, int))                                                   \
    X(deflateReset, int, (z_streamp))

#define ZLIB_POINTER(name, ret, args) static ret(*z_##name) args;
ZLIB_FUNCTIONS(ZLIB_POINTER)

static pthread_once_t z_once = PTHREAD_ONCE_INIT;
static bool z_loaded;

/* Guarded by the trace write lock. */
static z_stream z;
static int z_state;  /* 0: not set up yet, 1: ready, -1: failed (uncompressed from now on) */
#define BODY_MAX (TRACE_V2_TABLE_BYTES + (size_t)TRACE_V2_PLANES * TRACE_EV_PER_CHUNK)
static uint8_t raw[BODY_MAX];
static uint8_t packed[BODY_MAX];  /* compressed: kept only when smaller */

static void z_load(void)
{
    void *h = shim_dlopen("libz.so.1", RTLD_LOCAL | RTLD_NOW);
    if (!h) {
        shim_info("trace: cannot load libz.so.1 (%s): chunks are written uncompressed",
                  shim_dlerror());
        return;
    }
#define ZLIB_RESOLVE(name, ret, args)                                                   \
    *(void **)&z_##name = shim_dlsym(h, #name);                                         \
    if (!z_##name) {                                                                    \
        shim_info("trace: libz.so.1 has no " #name ": chunks are written uncompressed"); \
        return;                                                                         \
    }
    ZLIB_FUNCTIONS(ZLIB_RESOLVE)
    z_loaded = true;
}

void shim_tracecodec_load(void)
{
    pthread_once(&z_once, z_load);
}

/* zlib's fastest level: the writer compresses every event once; level 6
 * would save 0.2 to 0.4 bytes an event of some 7 for about twice the time
 * (docs/trace-format.md). */
#define Z_LEVEL 1

static bool z_ready(void)
{
    if (z_state == 0) {
        z_state = -1;
        if (z_loaded && z_deflateInit2_(&z, Z_LEVEL, Z_DEFLATED, 15, 8, Z_DEFAULT_STRATEGY,
                                        ZLIB_VERSION, (int)sizeof z) == Z_OK)
            z_state = 1;
    }
    return z_state == 1;
}

enum { COL_KIND, COL_DEV, COL_SITE, COL_SIZE, COL_SEQ, COL_TIME, COL_ADDR, NCOLS };
#define COLUMN_WIDTH(name, width) width,
static const unsigned width[NCOLS] = {TRACE_V2_COLUMNS(COLUMN_WIDTH)};

static inline uint64_t column(const trace_event *e, unsigned c, uint64_t seq)
{
    switch (c) {
    case COL_KIND: return (e->size_kind_dev >> 48) & 0xff;
    case COL_DEV: return e->size_kind_dev >> 56;
    case COL_SITE: return e->site;
    case COL_SIZE: return e->size_kind_dev & TRACE_SIZE_MASK;
    case COL_SEQ: return seq;
    case COL_TIME: return e->time_ns;
    default: return e->addr;
    }
}

/* The body, uncompressed, into raw: the table, then the planes that vary. */
static size_t planes(const trace_event *ev, uint32_t n, const uint64_t *seq)
{
    uint8_t *table = raw, *out = raw + TRACE_V2_TABLE_BYTES;
    for (unsigned c = 0; c < NCOLS; c++) {
        uint64_t first = column(&ev[0], c, seq[0]), differ = 0;
        for (uint32_t i = 1; i < n; i++)
            differ |= column(&ev[i], c, seq[i]) ^ first;
        uint8_t mask = 0;
        *table++ = 0; /* the mask, filled in below */
        for (unsigned b = 0; b < width[c]; b++) {
            bool varies = (differ >> (8 * b)) & 0xff;
            mask |= (uint8_t)(varies << b);
            *table++ = varies ? 0 : (uint8_t)(first >> (8 * b));
        }
        table[-(int)width[c] - 1] = mask;
        for (unsigned b = 0; b < width[c]; b++) {
            if (!(mask & (1u << b)))
                continue;
            for (uint32_t i = 0; i < n; i++)
                out[i] = (uint8_t)(column(&ev[i], c, seq[i]) >> (8 * b));
            out += n;
        }
    }
    return (size_t)(out - raw);
}

void shim_tracecodec_encode(const trace_event *ev, uint32_t n, uint64_t ref, bool compress,
                            struct trace_encoded *out)
{
    static uint64_t seq[TRACE_EV_PER_CHUNK];
    uint64_t base = UINT64_MAX;
    /* Events of one buffer lie within 2^31 sequence numbers of each other
     * (a flush interval's worth at most): each one's whole number is the
     * reference moved by the signed difference of the low bits. Not
     * computed while appending: it costs the allocating thread nothing. */
    for (uint32_t i = 0; i < n; i++) {
        seq[i] = ref + (uint64_t)(int64_t)(int32_t)(ev[i].seq_lo - (uint32_t)ref);
        if (seq[i] < base)
            base = seq[i];
    }
    out->seq_base = n ? base : 0;
    size_t len = n ? planes(ev, n, seq) : 0;
    out->body = raw;
    out->body_bytes = (uint32_t)len;
    out->flags = 0;
    if (!len || !compress || !z_ready())
        return;
    z.next_in = raw;
    z.avail_in = (uInt)len;
    z.next_out = packed;
    z.avail_out = (uInt)sizeof packed;
    int rc = z_deflate(&z, Z_FINISH);
    size_t zlen = sizeof packed - z.avail_out;
    if (z_deflateReset(&z) != Z_OK)
        z_state = -1;   /* the next chunks go uncompressed */
    if (rc == Z_STREAM_END && zlen < len) {
        out->body = packed;
        out->body_bytes = (uint32_t)zlen;
        out->flags = TRACE_CHUNK_ZLIB;
    }
}
