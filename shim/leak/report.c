/* Leak and live-memory reports: grouping, frame resolution, text, JSON.
 *
 * Owns nothing shared: a report is built from a copy of the live records
 * (taken by the caller under the allocator locks, which are released by
 * then) and is used by one thread. Never runs on the allocation path and
 * never takes the allocator lock, so it may call anything (malloc, stdio,
 * dladdr, libdw). Python frames come from the pystack module, which resolved
 * them while the interpreter was alive; this file never touches a Python
 * object.
 */
#include "report.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "escape.h"
#include "evalloop.h"
#include "pystack.h"
#include "rank.h"
#include "stack.h"
#include "symbolize.h"
#include "units.h"

struct shim_report {
    shim_report_group *groups;
    size_t ngroups;
    shim_symbolizer *sym;            /* owns the native names, unless borrowed */
    bool sym_borrowed;               /* sym is another report's (build_like) */
    const shim_suppressions *sup;
    uint64_t *sup_bytes, *sup_count; /* per pattern */
    shim_evalloop loop;              /* the evaluation loop's parts, by address */
};

static int key_cmp(const spyreshim_alloc_info *a, const spyreshim_alloc_info *b)
{
    int c = strcmp(a->runtime ? a->runtime : "", b->runtime ? b->runtime : "");
    if (c)
        return c;
    if (a->python_stack != b->python_stack)
        return a->python_stack < b->python_stack ? -1 : 1;
    if (a->native_stack != b->native_stack)
        return a->native_stack < b->native_stack ? -1 : 1;
    return 0;
}

static int info_cmp(const void *x, const void *y) { return key_cmp(x, y); }

static int group_cmp(const void *x, const void *y)
{
    const shim_report_group *a = x, *b = y;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    if (a->count != b->count)
        return a->count > b->count ? -1 : 1;
    int c = strcmp(a->runtime ? a->runtime : "", b->runtime ? b->runtime : "");
    if (c)
        return c;
    if (a->python_stack != b->python_stack)
        return a->python_stack < b->python_stack ? -1 : 1;
    return a->native_stack < b->native_stack ? -1 : a->native_stack > b->native_stack;
}

#define PY_FRAMES_MAX 256

/* The native frame of one call of CPython's evaluation loop: the function
 * each Python frame (before 3.11) or each run of Python frames entered from
 * C (3.11+) executes in, in every build (shared, static, debug,
 * free-threaded; 3.8's PyEval_EvalFrameEx and the _PyEval_EvalFrame and
 * _PyEval_Vector wrappers call it once per such call). A part that GCC
 * split out (".cold") is still that call. */
static bool is_eval_loop(const char *function)
{
    static const char name[] = "_PyEval_EvalFrameDefault";
    return function && strncmp(function, name, sizeof name - 1) == 0 &&
           (function[sizeof name - 1] == '\0' || function[sizeof name - 1] == '.');
}

/* Frames of the program's start, below any Python: libc's entry and
 * thread start, the executable's _start. */
static bool is_program_start(const char *function)
{
    static const char *const names[] = {
        "_start", "__libc_start_main", "__libc_start_main_impl", "__libc_start_main_alias_2",
        "__libc_start_call_main", "start_thread", "clone", "clone3", "thread_start",
    };
    if (!function)
        return false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(function, names[i]) == 0)
            return true;
    return false;
}

/* A frame of the C library without a symbol: below the outermost Python
 * frame, the program's start (__libc_start_call_main is local, and a C
 * library without .symtab, such as the one Debian unstable's Python
 * brings, leaves it nameless). */
static bool in_c_library_unnamed(const shim_report_frame *f)
{
    if (f->function || !f->object)
        return false;
    const char *base = strrchr(f->object, '/');
    base = base ? base + 1 : f->object;
    return strncmp(base, "libc.so", 7) == 0;
}

/* Python frames where the interpreter ran them: each native evaluation-loop
 * frame (innermost first) stands for the Python frames of one call, from
 * the frame after the previous entry from C down to the next entry (the
 * pystack module marks them). Pairing the i-th loop frame with the i-th
 * call is exact when both lists are complete; anything else (a cut stack,
 * counts that disagree, unsure marks) keeps Python frames first and says
 * why: a guessed order is never shown as fact. */
static const char *splice_refusal(const shim_pyframe *py, size_t npy, unsigned pyflags,
                                  size_t calls_native)
{
    if (pyflags & SHIM_PYSTACK_TRUNCATED)
        return "the Python stack was cut at the recorded depth";
    if ((pyflags & SHIM_PYSTACK_UNSURE) || !py[npy - 1].entry)
        return "which interpreter call ran which Python frame is not known";
    size_t calls_python = 0;
    for (size_t i = 0; i < npy; i++)
        calls_python += py[i].entry;
    if (calls_python != calls_native)
        return "the native stack does not hold one evaluation-loop frame per call entered from C "
               "(cut at SPYRESHIM_STACK_DEPTH?)";
    return NULL;
}

/* Default view: every native frame of the interpreter's own object (the
 * executable of a static build, or libpython; by address, so frames
 * without a symbol go too) is folded wherever it is: between the extension
 * and the innermost Python frame (type_call, vectorcall helpers), between
 * Python frames, and below the outermost one, where the program's start
 * goes too. A report then reads: the extension, the Python frames, the
 * embedder. */
static void fold(shim_report_group *g)
{
    size_t inner = g->nframes, outer = 0;
    for (size_t i = 0; i < g->nframes; i++) {
        if (g->frames[i].python) {
            if (inner == g->nframes)
                inner = i;
            outer = i;
        }
    }
    if (inner == g->nframes)
        return;
    for (size_t i = 0; i < g->nframes; i++) {
        shim_report_frame *f = &g->frames[i];
        if (f->python)
            continue;
        f->folded = f->interpreter || (i > outer && (is_program_start(f->function) ||
                                                     in_c_library_unnamed(f)));
        g->nfolded += f->folded;
    }
}

/* Appends one Python frame to the group's frames (calloc'd: every field
 * not set here is zero). */
static void push_python(shim_report_group *g, const shim_pyframe *p)
{
    shim_report_frame *f = &g->frames[g->nframes++];
    f->python = true;
    f->function = p->function;
    f->file = p->file;
    f->line = p->line;
    f->python_frames = -1;
}

static int resolve_frames(shim_report *r, shim_report_group *g)
{
    shim_pyframe py[PY_FRAMES_MAX];
    size_t npy = 0;
    if (g->python_stack) {
        npy = shim_pystack_frames(g->python_stack, py, PY_FRAMES_MAX);
        if (npy > PY_FRAMES_MAX)
            npy = PY_FRAMES_MAX;
    }
    const uintptr_t *nat = NULL;
    size_t nn = g->native_stack ? shim_stack_frames(g->native_stack, &nat) : 0;
    g->order = npy ? (nn ? SHIM_ORDER_HYBRID : SHIM_ORDER_PYTHON) : SHIM_ORDER_NATIVE;
    if (npy + nn == 0)
        return 0;
    g->frames = calloc(npy + nn, sizeof *g->frames);
    shim_report_frame *native = nn ? calloc(nn, sizeof *native) : NULL;
    if (!g->frames || (nn && !native)) {
        free(native);
        return -1;
    }
    /* The interpreter's object: the one pystack found, and the one that
     * holds the evaluation loop in this very stack (a static build's
     * executable, a libpython an embedder opened). */
    uintptr_t interp = shim_pystack_interpreter_base(), loop_base = 0;
    size_t calls_native = 0;
    for (size_t i = 0; i < nn; i++) {
        shim_report_frame *f = &native[i];
        shim_symbol s = {0};
        if (r->sym)
            shim_symbolize(r->sym, nat[i], &s);
        f->address = nat[i];
        f->function = s.function;
        f->raw = s.raw;
        f->file = s.file;
        f->line = s.line;
        f->object = s.object;
        f->offset = s.offset;
        f->python_frames = -1;
        /* By name, or by address where its parts have none (Debian's 3.14
         * and 3.15); the latter names the frame for the reader. */
        if (!is_eval_loop(f->function) && shim_evalloop_contains(&r->loop, f->address))
            f->function = "_PyEval_EvalFrameDefault";
        if (is_eval_loop(f->function)) {
            calls_native++;
            if (f->object)
                loop_base = f->address - f->offset;
        }
    }
    for (size_t i = 0; i < nn; i++) {
        uintptr_t base = native[i].object ? native[i].address - native[i].offset : 0;
        native[i].interpreter = base && (base == interp || base == loop_base);
    }
    if (npy && (shim_pystack_flags(g->python_stack) & SHIM_PYSTACK_ORIGIN))
        g->order = SHIM_ORDER_ORIGIN;      /* no call links them: the thread's own frames first */
    else if (npy && nn) {
        g->unspliced = splice_refusal(py, npy, shim_pystack_flags(g->python_stack), calls_native);
        if (g->unspliced)
            g->order = SHIM_ORDER_PYTHON_FIRST;
    }
    size_t next_py = 0;
    if (g->order != SHIM_ORDER_HYBRID && g->order != SHIM_ORDER_ORIGIN) {
        for (; next_py < npy; next_py++)
            push_python(g, &py[next_py]);
    }
    for (size_t i = 0; i < nn; i++) {
        if (g->order == SHIM_ORDER_HYBRID && is_eval_loop(native[i].function)) {
            int ran = 0;
            while (next_py < npy) {
                push_python(g, &py[next_py]);
                ran++;
                if (py[next_py++].entry)
                    break;
            }
            native[i].python_frames = ran;
        }
        g->frames[g->nframes++] = native[i];
    }
    free(native);
    for (; g->order == SHIM_ORDER_ORIGIN && next_py < npy; next_py++)
        push_python(g, &py[next_py]);
    if (g->order == SHIM_ORDER_HYBRID)
        fold(g);
    return 0;
}

static int match_suppression(const shim_report *r, const shim_report_group *g)
{
    if (!r->sup || shim_suppressions_count(r->sup) == 0)
        return -1;
    for (size_t i = 0; i < g->nframes; i++) {
        const shim_report_frame *f = &g->frames[i];
        const char *names[3] = {f->function, f->file, f->object};
        int m = shim_suppressions_match(r->sup, names, 3);
        if (m >= 0)
            return m;
    }
    return -1;
}

shim_report *shim_report_build(const spyreshim_alloc_info *allocs, size_t n,
                               const shim_suppressions *sup)
{
    return shim_report_build_like(allocs, n, sup, NULL);
}

shim_report *shim_report_build_like(const spyreshim_alloc_info *allocs, size_t n,
                                    const shim_suppressions *sup, const shim_report *like)
{
    shim_report *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->sup = sup;
    size_t np = shim_suppressions_count(sup);
    spyreshim_alloc_info *sorted = n ? malloc(n * sizeof *sorted) : NULL;
    r->groups = n ? calloc(n, sizeof *r->groups) : NULL;
    r->sup_bytes = calloc(np + 1, sizeof *r->sup_bytes);
    r->sup_count = calloc(np + 1, sizeof *r->sup_count);
    if ((n && (!sorted || !r->groups)) || !r->sup_bytes || !r->sup_count)
        goto fail;
    if (n) {
        memcpy(sorted, allocs, n * sizeof *sorted);
        qsort(sorted, n, sizeof *sorted, info_cmp);
    }
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || key_cmp(&sorted[i - 1], &sorted[i]) != 0) {
            shim_report_group *g = &r->groups[r->ngroups++];
            g->runtime = sorted[i].runtime;
            g->python_stack = sorted[i].python_stack;
            g->native_stack = sorted[i].native_stack;
            g->suppression = -1;
        }
        shim_report_group *g = &r->groups[r->ngroups - 1];
        g->bytes += sorted[i].size;
        g->count++;
    }
    free(sorted);
    sorted = NULL;
    qsort(r->groups, r->ngroups, sizeof *r->groups, group_cmp);
    r->sym_borrowed = r->ngroups && like && like->sym;
    r->sym = !r->ngroups ? NULL : r->sym_borrowed ? like->sym : shim_symbolizer_create();
    shim_evalloop_find(shim_pystack_eval_entry(), &r->loop);
    for (size_t i = 0; i < r->ngroups; i++) {
        shim_report_group *g = &r->groups[i];
        if (resolve_frames(r, g) != 0)
            goto fail;
        g->suppression = match_suppression(r, g);
        if (g->suppression >= 0) {
            r->sup_bytes[g->suppression] += g->bytes;
            r->sup_count[g->suppression] += g->count;
        }
    }
    return r;
fail:
    free(sorted);
    shim_report_free(r);
    return NULL;
}

void shim_report_free(shim_report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->ngroups; i++)
        free(r->groups[i].frames);
    free(r->groups);
    free(r->sup_bytes);
    free(r->sup_count);
    if (!r->sym_borrowed)
        shim_symbolizer_destroy(r->sym);
    free(r);
}

size_t shim_report_ngroups(const shim_report *r) { return r->ngroups; }

const shim_report_group *shim_report_group_at(const shim_report *r, size_t i)
{
    return i < r->ngroups ? &r->groups[i] : NULL;
}

void shim_report_totals(const shim_report *r, uint64_t *live_bytes, uint64_t *live_allocs,
                        uint64_t *suppressed_bytes, uint64_t *suppressed_allocs)
{
    uint64_t lb = 0, lc = 0, sb = 0, sc = 0;
    for (size_t i = 0; i < r->ngroups; i++) {
        const shim_report_group *g = &r->groups[i];
        if (g->suppression >= 0) {
            sb += g->bytes;
            sc += g->count;
        } else {
            lb += g->bytes;
            lc += g->count;
        }
    }
    if (live_bytes) *live_bytes = lb;
    if (live_allocs) *live_allocs = lc;
    if (suppressed_bytes) *suppressed_bytes = sb;
    if (suppressed_allocs) *suppressed_allocs = sc;
}

/* ---- text --------------------------------------------------------------- */

/* A buffered writer on a file descriptor (stderr may be a pipe shared with
 * other processes: whole lines in few writes keep reports readable). */
typedef struct out {
    int fd, err;
    size_t len;
    char buf[8192];
} out;

static void out_flush(out *o)
{
    size_t off = 0;
    while (off < o->len && !o->err) {
        ssize_t w = write(o->fd, o->buf + off, o->len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            o->err = errno;
        } else {
            off += (size_t)w;
        }
    }
    o->len = 0;
}

__attribute__((format(printf, 2, 3)))
static void outf(out *o, const char *fmt, ...)
{
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    size_t l = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    if (o->len + l > sizeof o->buf)
        out_flush(o);
    memcpy(o->buf + o->len, line, l);
    o->len += l;
}

/* A name from a stack (a function, a file, an object path) for the
 * terminal: control characters escaped, so that a crafted name (an escape
 * sequence in a Python function's name) cannot move the cursor, erase the
 * summary or forge a line. */
static const char *esc(const char *s, char *buf, size_t n)
{
    shim_escape_line(s, buf, n);
    return buf;
}

static void print_frame(out *o, size_t i, const shim_report_frame *f)
{
    char fn[1024], file[1024], obj[1024];
    if (f->python) {
        outf(o, "    #%zu in %s %s:%d [python]\n", i,
             f->function ? esc(f->function, fn, sizeof fn) : "<unknown>",
             f->file ? esc(f->file, file, sizeof file) : "<unknown>", f->line);
        return;
    }
    outf(o, "    #%zu 0x%" PRIxPTR, i, f->address);
    if (f->function)
        outf(o, " in %s", esc(f->function, fn, sizeof fn));
    if (f->file) {
        if (f->line)
            outf(o, " %s:%d", esc(f->file, file, sizeof file), f->line);
        else
            outf(o, " %s", esc(f->file, file, sizeof file));
    }
    if (f->object)
        outf(o, " (%s+0x%" PRIxPTR ")", esc(f->object, obj, sizeof obj), f->offset);
    outf(o, "\n");
}

size_t shim_report_printed_keys(const shim_report *r, size_t max_groups, shim_report_key *out,
                                size_t n)
{
    size_t k = 0, shown = 0;
    for (size_t i = 0; i < r->ngroups && k < n && (!max_groups || shown < max_groups); i++) {
        const shim_report_group *g = &r->groups[i];
        if (g->suppression >= 0)
            continue;
        shown++;
        if (g->nframes == 0)
            continue;
        snprintf(out[k].runtime, sizeof out[k].runtime, "%s", g->runtime ? g->runtime : "");
        out[k].python_stack = g->python_stack;
        out[k].native_stack = g->native_stack;
        k++;
    }
    return k;
}

void shim_report_mark_printed(shim_report *r, const shim_report_key *keys, size_t n)
{
    for (size_t i = 0; i < r->ngroups; i++) {
        shim_report_group *g = &r->groups[i];
        for (size_t k = 0; k < n && !g->printed_before; k++)
            g->printed_before = g->nframes && keys[k].python_stack == g->python_stack &&
                                keys[k].native_stack == g->native_stack &&
                                !strcmp(keys[k].runtime, g->runtime ? g->runtime : "");
    }
}

int shim_report_print(const shim_report *r, int fd, enum shim_report_kind kind,
                      const char *headline, size_t max_groups)
{
    out *o = malloc(sizeof *o);
    if (!o)
        return -1;
    o->fd = fd;
    o->err = 0;
    o->len = 0;
    uint64_t lb, lc, sb, sc;
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    size_t live_groups = 0;
    for (size_t i = 0; i < r->ngroups; i++)
        live_groups += r->groups[i].suppression < 0;
    int pid = (int)getpid();

    outf(o, "\n=================================================================\n");
    outf(o, "==%d==%s\n", pid, headline);
    const char *note = shim_pystack_note();
    if (note)
        outf(o, "(%s)\n", note);
    size_t shown = 0;
    uint64_t rest_bytes = 0, rest_count = 0;
    for (size_t i = 0; i < r->ngroups; i++) {
        const shim_report_group *g = &r->groups[i];
        if (g->suppression >= 0)
            continue;
        if (max_groups && shown == max_groups) {
            rest_bytes += g->bytes;
            rest_count += g->count;
            continue;
        }
        shown++;
        char rt[256], sz[SHIM_SIZE_TEXT];
        outf(o, "\n%s %s in %" PRIu64 " allocation(s) of %s memory, allocated from:\n",
             kind == SHIM_REPORT_LEAKS ? "Leak of" : kind == SHIM_REPORT_HELD ? "Held until exit:" : "Live:",
             shim_size_text(sz, g->bytes), g->count,
             g->runtime ? esc(g->runtime, rt, sizeof rt) : "device");
        if (g->nframes == 0)
            outf(o, "    <no stack recorded>\n");
        size_t shown_frames = 0;
        for (size_t k = 0; k < g->nframes && !(g->printed_before && shown_frames); k++)
            if (!g->frames[k].folded)
                print_frame(o, shown_frames++, &g->frames[k]);
        if (g->printed_before) {
            /* Each stack once: the rest is in the report printed above. */
            outf(o, "    (the same stack as in the out-of-memory report above)\n");
            out_flush(o);
            continue;
        }
        if (g->nfolded)
            outf(o, "    (%zu interpreter frame(s) folded; the JSON report keeps every frame)\n",
                 g->nfolded);
        char why[512];
        if (g->order == SHIM_ORDER_PYTHON_FIRST)
            outf(o, "    (unspliced, Python frames first: %s)\n",
                 esc(g->unspliced ? g->unspliced : "?", why, sizeof why));
        if (g->order == SHIM_ORDER_ORIGIN)
            outf(o, "    (a thread without Python frames; the Python frames are the call that "
                    "started its work)\n");
        out_flush(o);
    }
    char sz[SHIM_SIZE_TEXT];
    if (rest_count)
        outf(o, "\n... and %zu more group(s): %s in %" PRIu64 " allocation(s)\n",
             live_groups - shown, shim_size_text(sz, rest_bytes), rest_count);
    if (sc) {
        /* One line, as `spyreshim report` counts them, with the allocations
         * each pattern matched. */
        outf(o, "\nSuppressed: %s in %" PRIu64 " allocation(s) matched suppressions (",
             shim_size_text(sz, sb), sc);
        const char *sep = "";
        for (size_t i = 0; i < shim_suppressions_count(r->sup); i++)
            if (r->sup_count[i]) {
                char pat[1024];
                outf(o, "%s%s: %" PRIu64, sep,
                     esc(shim_suppressions_pattern(r->sup, i), pat, sizeof pat), r->sup_count[i]);
                sep = ", ";
            }
        outf(o, ").\n");
    }
    outf(o, "\nSUMMARY: spyreshim: %s %s in %" PRIu64 " allocation(s).\n",
         shim_size_text(sz, lb), kind == SHIM_REPORT_LEAKS ? "leaked" : kind == SHIM_REPORT_HELD ? "held until exit" : "live",
         lc);
    out_flush(o);
    int err = o->err;
    free(o);
    if (err) {
        errno = err;
        return -1;
    }
    return 0;
}

/* ---- JSON --------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at p (its lead byte >= 0x80),
 * or 0 when it is not one (overlong forms, surrogates and values above
 * U+10FFFF are not). */
static size_t utf8_len(const unsigned char *p)
{
    size_t l;
    uint32_t c;
    if (p[0] >= 0xc2 && p[0] <= 0xdf) {
        l = 2;
        c = p[0] & 0x1f;
    } else if (p[0] >= 0xe0 && p[0] <= 0xef) {
        l = 3;
        c = p[0] & 0x0f;
    } else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
        l = 4;
        c = p[0] & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < l; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;   /* also stops at the terminating NUL */
        c = (c << 6) | (p[i] & 0x3f);
    }
    if ((l == 3 && (c < 0x800 || (c >= 0xd800 && c <= 0xdfff))) ||
        (l == 4 && (c < 0x10000 || c > 0x10ffff)))
        return 0;
    return l;
}

static void json_str(FILE *f, const char *s)
{
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p >= 0x80) {
            /* Paths are bytes. A well-formed UTF-8 sequence passes through;
             * any other byte is written as \udcXX (XX its value), Python's
             * surrogateescape (PEP 383): reversible with os.fsencode, and
             * the file stays valid UTF-8 JSON (docs/report-format.md). */
            size_t l = utf8_len(p);
            if (l) {
                fwrite(p, 1, l, f);
                p += l - 1;
            } else {
                fprintf(f, "\\udc%02x", *p);
            }
            continue;
        }
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);   /* UTF-8 passes through; paths are bytes */
        }
    }
    fputc('"', f);
}

/* A group's "order" (and "unspliced") and "frames" members, each member
 * after `sep`, each frame after `fsep`. */
static void write_order_frames(FILE *f, const shim_report_group *g, const char *sep,
                               const char *fsep)
{
    static const char *const orders[] = {
        [SHIM_ORDER_NATIVE] = "native", [SHIM_ORDER_PYTHON] = "python",
        [SHIM_ORDER_HYBRID] = "hybrid", [SHIM_ORDER_PYTHON_FIRST] = "python-first",
        [SHIM_ORDER_ORIGIN] = "origin",
    };
    fprintf(f, "\"order\": \"%s\"", orders[g->order]);
    if (g->unspliced) {
        fprintf(f, ",%s\"unspliced\": ", sep);
        json_str(f, g->unspliced);
    }
    fprintf(f, ",%s\"frames\": [", sep);
    for (size_t k = 0; k < g->nframes; k++) {
        const shim_report_frame *fr = &g->frames[k];
        fprintf(f, "%s%s{\"kind\": \"%s\", \"function\": ", k ? "," : "", fsep,
                fr->python ? "python" : "native");
        json_str(f, fr->function);
        if (fr->raw) {
            fputs(", \"raw\": ", f);
            json_str(f, fr->raw);
        }
        if (!fr->python) {
            fputs(", \"object\": ", f);
            json_str(f, fr->object);
            fprintf(f, ", \"address\": \"0x%" PRIxPTR "\", \"offset\": \"0x%" PRIxPTR "\"",
                    fr->address, fr->offset);
            fprintf(f, ", \"interpreter\": %s", fr->interpreter ? "true" : "false");
            fprintf(f, ", \"folded\": %s", fr->folded ? "true" : "false");
            if (fr->python_frames >= 0)
                fprintf(f, ", \"python_frames\": %d", fr->python_frames);
        }
        if (fr->file || fr->python) {
            fputs(", \"file\": ", f);
            json_str(f, fr->file);
            fprintf(f, ", \"line\": %d", fr->line);
        }
        fputc('}', f);
    }
    fprintf(f, "%s]", g->nframes ? sep : "");
}

void shim_report_json_site(FILE *f, const shim_report_group *g, const char *runtime)
{
    fputs("\"runtime\": ", f);
    json_str(f, g ? g->runtime : runtime);
    fputs(", ", f);
    if (g) {
        write_order_frames(f, g, " ", " ");
    } else {
        fputs("\"order\": \"native\", \"frames\": []", f);
    }
}

/* Which rank of which launch wrote the report (base/rank.c): the numbers a
 * launcher set, its run id, and the host always. */
static void write_launch(FILE *f)
{
    const shim_rank *id = shim_rank_get();
    const struct { const char *key, *value; } num[] = {
        {"rank", id->rank}, {"local_rank", id->local_rank},
        {"world_size", id->world_size}, {"restart", id->restart},
    };
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++)
        if (num[i].value)   /* decimal digits only (rank.c), so a JSON number */
            fprintf(f, ",\n  \"%s\": %llu", num[i].key, strtoull(num[i].value, NULL, 10));
    if (id->run_id) {
        fputs(",\n  \"run_id\": ", f);
        json_str(f, id->run_id);
    }
    fputs(",\n  \"host\": ", f);
    json_str(f, id->host);
}

/* The "groups" array's elements and its closing bracket. */
static void write_groups(FILE *f, const shim_report *r)
{
    for (size_t i = 0; i < r->ngroups; i++) {
        const shim_report_group *g = &r->groups[i];
        fprintf(f, "%s\n    {\n      \"bytes\": %" PRIu64 ",\n      \"count\": %" PRIu64
                   ",\n      \"runtime\": ",
                i ? "," : "", g->bytes, g->count);
        json_str(f, g->runtime);
        fprintf(f, ",\n      \"suppressed\": %s,\n      ", g->suppression >= 0 ? "true" : "false");
        write_order_frames(f, g, "\n      ", "\n        ");
        fputs("\n    }", f);
    }
    fprintf(f, "%s]", r->ngroups ? "\n  " : "");
}

char *shim_report_groups_json(const shim_report *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    uint64_t lb, lc, sb, sc;
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    fprintf(f, "{\"bytes\": %" PRIu64 ", \"allocations\": %" PRIu64
               ", \"suppressed_bytes\": %" PRIu64 ", \"suppressed_allocations\": %" PRIu64
               ", \"groups\": [",
            lb, lc, sb, sc);
    write_groups(f, r);
    fputc('}', f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

int shim_report_write_json(const shim_report *r, FILE *f, const char *reason)
{
    return shim_report_write_json_extra(r, f, reason, NULL);
}

int shim_report_write_json_extra(const shim_report *r, FILE *f, const char *reason,
                                 const char *members)
{
    uint64_t lb, lc, sb, sc;
    shim_report_totals(r, &lb, &lc, &sb, &sc);
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = '\0';

    fprintf(f, "{\n  \"format\": \"spyreshim-report\",\n  \"version\": 1,\n");
    fprintf(f, "  \"pid\": %d,\n  \"exe\": ", (int)getpid());
    json_str(f, n > 0 ? exe : NULL);
    write_launch(f);
    fprintf(f, ",\n  \"reason\": ");
    json_str(f, reason);
    const char *note = shim_pystack_note();
    if (note) {
        fprintf(f, ",\n  \"python_note\": ");
        json_str(f, note);
    }
    fprintf(f, ",\n  \"live_bytes\": %" PRIu64 ",\n  \"live_allocations\": %" PRIu64
               ",\n  \"suppressed_bytes\": %" PRIu64 ",\n  \"suppressed_allocations\": %" PRIu64
               ",\n  \"groups\": [",
            lb, lc, sb, sc);
    write_groups(f, r);
    if (members)
        fprintf(f, ",\n  %s", members);
    fputs("\n}\n", f);
    if (fflush(f) != 0 || ferror(f)) {
        if (!errno)
            errno = EIO;
        return -1;
    }
    return 0;
}
