/* Names at exit (tracenames.h): every native frame of the trace
 * symbolized in-process (shim/leak/symbolize.c) and every Python stack
 * (resolved while the interpreter lived), written once each.
 *
 * Owns nothing past the call: the sets of what was already named live on
 * the stack of shim_tracenames_add. No lock of its own, and none of ours
 * may be held by its caller: symbolizing calls the loader. Runs once, from
 * the destructor; never on an allocating thread. */
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

static void seen_free(struct seen *s)
{
    shim_hashidx_destroy(&s->idx);
    free(s->v);
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

void shim_tracenames_add(struct trace_meta_buf *m)
{
    shim_symbolizer *sym = shim_symbolizer_create();
    struct interp_marks im = {.interp = shim_pystack_interpreter_base()};
    shim_evalloop_find(shim_pystack_eval_entry(), &im.loop);
    struct seen addrs;
    seen_init(&addrs);
    const uint32_t *ids;
    size_t nids = shim_tracefile_native_stacks(&ids);
    for (size_t i = 0; sym && i < nids; i++) {
        const uintptr_t *frames;
        size_t nf = shim_stack_frames(ids[i], &frames);
        for (size_t k = 0; k < nf; k++)
            if (frames[k] && seen_first(&addrs, frames[k]))
                add_symbol(m, sym, &im, frames[k]);
    }
    seen_free(&addrs);
    if (sym)
        shim_symbolizer_destroy(sym);
    /* Python stacks were resolved while the interpreter was alive. */
    struct seen py;
    seen_init(&py);
    uint32_t n;
    struct trace_site *sites = shim_tracesites_since(0, &n);
    for (uint32_t i = 0; i < n; i++)
        if (sites[i].pystack && seen_first(&py, sites[i].pystack))
            add_pystack(m, sites[i].pystack);
    free(sites);
    seen_free(&py);
}
