/* Names (tracenames.h), written as the frames are first seen: with each
 * flush, every native frame new to the file symbolized in-process
 * (shim/leak/symbolize.c) and every Python stack new to it whose frames
 * are resolved (those still to be resolved are asked for, and written by a
 * later flush or at exit), each once per file.
 *
 * Owns the sets of what the file was given (addresses, Python stacks) and
 * the Python stacks left for later. No lock of its own: one caller at a
 * time holds the names token (tracewriter.c: taken under the trace write
 * lock, held without it), the writer thread or the destructor. None of
 * ours may be held meanwhile: symbolizing calls the loader. Never on an
 * allocating thread; never waits for the GIL. */
#include <stdlib.h>
#include <string.h>

#include "evalloop.h"
#include "hashidx.h"
#include "pystack.h"
#include "stack.h"
#include "symbolize.h"
#include "tracenames.h"
#include "tracesites.h"

#define PYSTACK_MAX_FRAMES 256

/* A set of 64-bit values on the one index: the values in an array, the
 * index keyed by their hash. */
struct seen {
    shim_hashidx idx;
    uint64_t *v;           /* v[id - 1] */
    size_t n, cap;
};

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static uint64_t seen_hash(const void *ctx, uint32_t id)
{
    return mix(((const struct seen *)ctx)->v[id - 1]);
}

static bool seen_eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    (void)hash;
    return ((const struct seen *)ctx)->v[id - 1] == *(const uint64_t *)key;
}

static void seen_init(struct seen *s)
{
    memset(s, 0, sizeof *s);
    s->idx = (shim_hashidx)SHIM_HASHIDX_INIT(seen_hash, seen_eq, s, false);
}

/* True the first time `value` is offered; false after, or when out of
 * memory (the name is then left out). */
static bool seen_first(struct seen *s, uint64_t value)
{
    uint64_t h = mix(value);
    if (shim_hashidx_find(&s->idx, h, &value))
        return false;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 4096;
        uint64_t *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = cap;
    }
    if (s->n >= UINT32_MAX - 1 || !shim_hashidx_reserve(&s->idx, 1))
        return false;
    s->v[s->n++] = value;
    shim_hashidx_insert(&s->idx, h, (uint32_t)s->n);
    return true;
}

/* What a reader needs to splice Python frames into native stacks as the
 * leak report does (shim/leak/report.c): which frames are the evaluation
 * loop (by name, or by address where its parts have none) and which lie in
 * the interpreter's own object (by load address). */
struct interp_marks {
    shim_evalloop loop;
    uintptr_t interp;
};

static uint32_t symbol_flags(const struct interp_marks *im, uintptr_t a, const shim_symbol *s)
{
    uint32_t fl = 0;
    if (shim_evalloop_contains(&im->loop, a))
        fl |= TRACE_SYMBOL_EVAL_LOOP;
    if (s->object && im->interp && a - s->offset == im->interp)
        fl |= TRACE_SYMBOL_INTERPRETER;
    return fl;
}

static void add_symbol(struct trace_meta_buf *m, shim_symbolizer *sym,
                       const struct interp_marks *im, uintptr_t a)
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
        uint32_t flags;
    } head = {a, s.line, symbol_flags(im, a, &s)};
    shim_tracefile_meta_add(m, TRACE_META_SYMBOL, &head, sizeof head, str, lf + lfile + lo);
    free(str);
}

static void add_pystack(struct trace_meta_buf *m, uint32_t id)
{
    shim_pyframe fr[PYSTACK_MAX_FRAMES];
    size_t n = shim_pystack_frames(id, fr, PYSTACK_MAX_FRAMES);
    if (n > PYSTACK_MAX_FRAMES)
        n = PYSTACK_MAX_FRAMES;
    struct trace_meta_buf body = {0};
    for (size_t i = 0; i < n; i++) {
        const char *fn = fr[i].function ? fr[i].function : "<unknown>";
        const char *file = fr[i].file ? fr[i].file : "";
        size_t lf = strlen(fn) + 1, lfile = strlen(file) + 1;
        shim_tracefile_meta_reserve(&body, 4 + lf + lfile);
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
        shim_tracefile_meta_add(m, TRACE_META_PYSTACK, head, sizeof head, body.p, body.len);
    }
    free(body.p);
    /* The entry marks and the stack's flags: which frames each call of the
     * evaluation loop ran (a reader without this record keeps Python
     * frames first). */
    unsigned char marks[PYSTACK_MAX_FRAMES];
    for (size_t i = 0; i < n; i++)
        marks[i] = fr[i].entry;
    uint32_t mhead[2] = {id, shim_pystack_flags(id)};
    shim_tracefile_meta_add(m, TRACE_META_PYMARKS, mhead, sizeof mhead, marks, n);
}

/* What the file has been given (its names are written once each), and
 * the Python stacks whose frames were still to be resolved last time. */
static struct seen addrs_named, py_named;
static bool seen_ready;
static uint32_t sites_named;      /* sites of the file whose Python stack was looked at */
static uint32_t *py_later;        /* Python stacks to name when resolved */
static size_t n_later, cap_later;

static void later_add(uint32_t id)
{
    if (n_later == cap_later) {
        size_t cap = cap_later ? cap_later * 2 : 64;
        uint32_t *p = realloc(py_later, cap * sizeof *p);
        if (!p)
            return;              /* named at exit instead (its site is in the file) */
        py_later = p;
        cap_later = cap;
    }
    py_later[n_later++] = id;
}

/* A Python stack's records, unless it was written already; while some of
 * its frames may still be resolved (and `final` is false), later. */
static void offer_pystack(struct trace_meta_buf *m, uint32_t id, bool final)
{
    uint64_t key = id;
    if (shim_hashidx_find(&py_named.idx, mix(key), &key))
        return;
    if (!final && shim_pystack_pending(id)) {
        later_add(id);
        return;
    }
    if (seen_first(&py_named, key))
        add_pystack(m, id);
}

void shim_tracenames_add(struct trace_meta_buf *m, const uint32_t *nstacks, size_t nids,
                         uint32_t sites_in_file, bool final)
{
    if (!seen_ready) {
        seen_init(&addrs_named);
        seen_init(&py_named);
        seen_ready = true;
    }
    /* Native frames: one symbolizer (a libdw session) for this call, made
     * only when some frame is new to the file. */
    shim_symbolizer *sym = NULL;
    struct interp_marks im;
    for (size_t i = 0; i < nids; i++) {
        const uintptr_t *frames;
        size_t nf = shim_stack_frames(nstacks[i], &frames);
        for (size_t k = 0; k < nf; k++) {
            if (!frames[k] || !seen_first(&addrs_named, frames[k]))
                continue;
            if (!sym) {
                sym = shim_symbolizer_create();
                if (!sym)
                    break;
                im.interp = shim_pystack_interpreter_base();
                shim_evalloop_find(shim_pystack_eval_entry(), &im.loop);
            }
            add_symbol(m, sym, &im, frames[k]);
        }
    }
    if (sym)
        shim_symbolizer_destroy(sym);
    /* Python stacks: those of the sites new to the file, and those left
     * for later; frames still to be resolved are asked for (the main
     * thread resolves them at its next check for pending calls), and
     * named by a later flush. At exit (`final`) every one is written with
     * what was resolved. */
    size_t retry = n_later;
    uint32_t *again = NULL;
    if (retry) {
        again = py_later;
        py_later = NULL;
        n_later = cap_later = 0;
    }
    for (size_t i = 0; i < retry; i++)
        offer_pystack(m, again[i], final);
    free(again);
    if (sites_in_file > sites_named) {
        uint32_t n;
        struct trace_site *sites = shim_tracesites_since(sites_named, &n);
        if (n > sites_in_file - sites_named)
            n = sites_in_file - sites_named;
        for (uint32_t i = 0; i < n; i++)
            if (sites[i].pystack)
                offer_pystack(m, sites[i].pystack, final);
        free(sites);
        if (sites || n == 0)
            sites_named += n;
    }
    if (n_later && !final)
        shim_pystack_resolve_soon();
}

void shim_tracenames_atfork_child(void)
{
    /* The parent's writer may have been changing these as it forked: left
     * as they are (not freed), and begun again for the child's file. */
    memset(&addrs_named, 0, sizeof addrs_named);
    memset(&py_named, 0, sizeof py_named);
    seen_ready = false;
    sites_named = 0;
    py_later = NULL;
    n_later = cap_later = 0;
}
