/* Python stacks of allocating threads: capture on the hot path, interning,
 * and resolution to function/file/line at report time.
 *
 * Lock: `stack_lock`, a leaf of its own (never the allocator lock; nothing
 * else is taken and no Python API is called while it is held, except
 * Py_IncRef on a thread attached to the interpreter). Order: the GIL, then
 * stack_lock, never the reverse.
 *
 * Capture never takes the GIL and never changes a reference count unless
 * the calling thread holds it: it reads the calling thread's own frame
 * chain (pyframes.c), which cannot change while that thread is inside the
 * allocation. A frame is kept as (code object, instruction offset) plus
 * what recognizes the code object later (its name's address and hash, its
 * file, its first line), so that a dead code object whose address is
 * reused makes a new frame instead of taking the old one's name. Where the
 * capturing thread holds the GIL, the frame also holds a reference to its
 * code object (main interpreter only) until the interpreter finalizes;
 * elsewhere resolution first checks, through the kernel, that the object
 * still is that code object, and a pending call asks the main thread to
 * resolve such frames soon, while they most likely live.
 *
 * Resolution calls Python (PyCode_Addr2Line, PyUnicode_AsUTF8, and for a
 * non-UTF-8 name PyUnicode_EncodeFSDefault) only with
 * the GIL held, while the interpreter is initialized, not finalizing, and
 * before the finalization gate of python_gc has run this module's hook:
 * after that, frames of that interpreter lifetime keep what they resolved
 * (or "<unknown>"); frames captured with the GIL after the gate (atexit
 * handlers) are resolved on the spot. Nothing here ever touches a Python
 * object after finalization. The gate's count of finalizations tells an
 * embedder's next lifetime, whose frames never merge with the old ones.
 *
 * PyPy: no frames (its frames are not in memory in a form we can read);
 * leak reports have native stacks only there.
 *
 * Memory is bounded (MAX_FRAMES, MAX_STACKS, MAX_POOL): when full, new
 * stacks are not recorded (id 0) and one warning says so.
 * Locks, their order and fork: docs/locking.md. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "clock.h"
#include "find.h"
#include "gate.h"
#include "hashidx.h"
#include "loader.h"
#include "log.h"
#include "pyapi.h"
#include "mutex.h"
#include "pyframes.h"
#include "pystack.h"

#define MAX_DEPTH 256           /* frames per stack, whatever the caller asks */
/* Bounds of the tables (tests build with small ones). */
#ifndef MAX_FRAMES
#define MAX_FRAMES (1u << 20)   /* unique (code, offset) frames */
#endif
#ifndef MAX_STACKS
#define MAX_STACKS (1u << 20)
#endif
#ifndef MAX_POOL
#define MAX_POOL (1u << 24)     /* frame ids over all stacks */
#endif

static const char UNKNOWN[] = "<unknown>";

typedef struct pframe {
    shim_pyrawframe raw;
    uint32_t epoch;              /* interpreter lifetime it was seen in */
    uint8_t held;                /* we own a reference to raw.code */
    uint8_t done;                /* function/file/line are final */
    const char *function, *file;
    int line;
} pframe;

typedef struct pstack {
    uint64_t hash;
    uint32_t first;              /* into pool */
    uint32_t depth;
    uint8_t flags;               /* SHIM_PYSTACK_TRUNCATED, SHIM_PYSTACK_UNSURE */
} pstack;

/* A pool slot is a frame id, with this bit set when the frame is the
 * outermost one a call of the evaluation loop ran (frame ids stay below
 * MAX_FRAMES): the splice of Python frames into native stacks needs it,
 * and it costs no memory. */
#define POOL_ENTRY 0x80000000u
#define POOL_ID(slot) ((slot) & ~POOL_ENTRY)

enum { ST_UNKNOWN = 0, ST_READY, ST_OFF };

static pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int state = ST_UNKNOWN;
static _Atomic bool verified;         /* a checked walk agreed with the layout */
static _Atomic bool closed;           /* this lifetime's finalization gate ran */
static _Atomic unsigned long closed_cycle; /* shim_gate_cycles() when it ran */
static _Atomic bool resolve_scheduled;    /* a pending call will resolve frames */
static _Atomic uint32_t epoch = 1;
static shim_pylayout L;
static const shim_pyapi *api;          /* python_gc's table (pyapi.c) */
static uintptr_t interp_base;          /* load address of the interpreter's object */
static uintptr_t eval_entry;           /* _PyEval_EvalFrameDefault */
static const char *off_note;           /* why this process has no Python stacks */
static bool full_warned;

/* Guarded by stack_lock. */
static pframe *frames;
static uint32_t nframes, frames_cap;
static pstack *stacks;
static uint32_t nstacks, stacks_cap;
static uint32_t *pool;
static uint32_t npool, pool_cap;

static inline uint64_t mix(uint64_t h, uint64_t x)
{
    h ^= x;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static inline uint64_t frame_hash(const shim_pyrawframe *f, uint32_t ep)
{
    uint64_t h = mix(ep, f->code);
    h = mix(h, ((uint64_t)(uint32_t)f->offset << 32) | (uint32_t)f->firstlineno);
    h = mix(h, f->name ^ (f->file << 1));
    return mix(h, (uint64_t)f->name_hash);
}

static inline bool raw_equal(const shim_pyrawframe *a, const shim_pyrawframe *b)
{
    return a->code == b->code && a->offset == b->offset && a->name == b->name &&
           a->name_hash == b->name_hash && a->file == b->file && a->firstlineno == b->firstlineno;
}

/* The interning lock, then the pipe lock of checked reads (a leaf). */
void shim_pystack_atfork_prepare(void)
{
    shim_mutex_lock(&stack_lock);
    shim_pyframes_atfork_prepare();
}

void shim_pystack_atfork_parent(void)
{
    shim_pyframes_atfork_parent();
    shim_mutex_unlock(&stack_lock);
}

void shim_pystack_atfork_child(void)
{
    shim_pyframes_atfork_child();
    shim_mutex_unlock(&stack_lock);
}

static void on_finalize(void);

/* Locates the interpreter, its layout and entry points. Runs without
 * stack_lock: discovery and symbol lookup take the dynamic loader's lock,
 * which a library constructor that allocates holds while it waits for
 * ours. Concurrent first captures may both do it; the first publishes. */
static void setup(void)
{
    const shim_python *py = shim_python_find();
    if (!py)
        return;                      /* maybe later: Python may be loaded yet */
    shim_pylayout l;
    const shim_pyapi *a = NULL;
    const char *why = NULL;
    int result = ST_READY;
    if (shim_pyframes_layout(py, &l, true, &why) != 0) {
        if (py->kind == SHIM_PY_CPYTHON)
            shim_warn("Python stacks off for CPython %d.%d: %s", py->major, py->minor, why);
        else
            shim_debug("Python stacks off: %s", why);
        result = ST_OFF;
    } else {
        a = shim_pyapi_get();
        if (!a || !a->code_addr2line || !a->unicode_as_utf8) {
            shim_warn("Python stacks off: a C API function is missing from %s",
                      py->path ? py->path : "the interpreter");
            result = ST_OFF;
        }
    }
    uintptr_t base = 0;
    Dl_info info;
    void *probe = shim_python_sym(py, py->kind == SHIM_PY_PYPY ? "PyPy_IsInitialized"
                                                               : "Py_IsInitialized");
    if (probe && shim_dladdr(probe, &info))
        base = (uintptr_t)info.dli_fbase;
    uintptr_t loop = py->kind == SHIM_PY_CPYTHON
                         ? (uintptr_t)shim_python_sym(py, "_PyEval_EvalFrameDefault")
                         : 0;
    bool first = false;
    shim_mutex_lock(&stack_lock);
    if (atomic_load(&state) == ST_UNKNOWN) {
        L = l;
        api = a;
        interp_base = base;
        eval_entry = loop;
        if (py->kind == SHIM_PY_PYPY)
            off_note = "PyPy: Python frames are not recorded, native stacks only";
        else if (result != ST_READY)
            off_note = "Python frames are not recorded for this interpreter (see the warning)";
        atomic_store_explicit(&state, result, memory_order_release);
        first = result == ST_READY;
    }
    shim_mutex_unlock(&stack_lock);
    if (first) {
        shim_debug("Python stacks: CPython %d.%d%s, frame layout from the %s", py->major,
                   py->minor, L.free_threaded ? " (free-threaded)" : "", L.source);
        shim_gate_at_finalize(on_finalize);
    }
}

static bool ready(void)
{
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == ST_READY)
        return true;
    if (s == ST_OFF)
        return false;
    setup();
    return atomic_load_explicit(&state, memory_order_acquire) == ST_READY;
}

/* The thread state whose frames are the caller's, and whether the caller
 * is attached to it (holds the GIL): python_gc's one rule (pyapi.h). */
static inline uintptr_t own_tstate(bool *attached)
{
    return (uintptr_t)shim_py_own_tstate(api, attached, NULL);
}

/* Interpreter initialized, not finalizing, this lifetime's gate not yet
 * run, and the caller holds the GIL: Python objects may be used. */
static bool can_resolve(void)
{
    if (atomic_load_explicit(&state, memory_order_acquire) != ST_READY || atomic_load(&closed))
        return false;
    if (!api->is_initialized() || api->is_finalizing())
        return false;
    bool attached;
    return own_tstate(&attached) && attached;
}

/* After the gate ran, frames are recorded but not resolved, until the gate
 * has seen this lifetime's finalization end and the interpreter is up
 * again (an embedder's next Py_Initialize): a new lifetime, whose frames
 * must not merge with the old one's (code addresses are reused), and whose
 * own gate must be armed. */
static void maybe_reopen(void)
{
    if (shim_gate_cycles() == atomic_load(&closed_cycle) || !api->is_initialized() ||
        api->is_finalizing())
        return;
    bool reopened = false;
    shim_mutex_lock(&stack_lock);
    if (atomic_load(&closed)) {
        atomic_fetch_add(&epoch, 1);
        atomic_store(&resolve_scheduled, false);   /* a call left pending died with the old one */
        atomic_store(&closed, false);
        reopened = true;
    }
    shim_mutex_unlock(&stack_lock);
    if (reopened)
        shim_gate_at_finalize(on_finalize);
}

static void warn_full_locked(void)
{
    if (!full_warned)
        shim_warn("Python stack table full (%u stacks, %u frames): new stacks are not recorded",
                  nstacks, nframes);
    full_warned = true;
}

static bool grow(void **arr, uint32_t *cap, uint32_t need, size_t elem, uint32_t limit)
{
    if (need <= *cap)
        return true;
    if (need > limit)
        return false;
    uint32_t c = *cap ? *cap : 64;
    while (c < need)
        c = c > limit / 2 ? limit : c * 2;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = c;
    return true;
}

/* The two indexes (shim/base/hashidx.h), guarded by stack_lock: frame id
 * and stack id (index + 1) by hash, equality decided here. */
struct frame_key {
    const shim_pyrawframe *f;
    uint32_t ep;
};

static uint64_t frame_hash_of(const void *ctx, uint32_t id)
{
    (void)ctx;
    return frame_hash(&frames[id - 1].raw, frames[id - 1].epoch);
}

static bool frame_eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    (void)ctx, (void)hash;
    const struct frame_key *k = key;
    return frames[id - 1].epoch == k->ep && raw_equal(&frames[id - 1].raw, k->f);
}

static shim_hashidx frame_index = SHIM_HASHIDX_INIT(frame_hash_of, frame_eq, NULL, false);

/* The id (index + 1) of frame `f` of lifetime `ep`, added when new (with a
 * reference to its code object when `take_ref`). 0 when the table is full. */
static uint32_t frame_intern_locked(const shim_pyrawframe *f, uint32_t ep, bool take_ref)
{
    uint64_t h = frame_hash(f, ep);
    struct frame_key key = {f, ep};
    uint32_t found = shim_hashidx_find(&frame_index, h, &key);
    if (found)
        return found;
    if (!grow((void **)&frames, &frames_cap, nframes + 1, sizeof *frames, MAX_FRAMES) ||
        !shim_hashidx_reserve(&frame_index, 1))
        return 0;
    pframe *p = &frames[nframes++];
    memset(p, 0, sizeof *p);
    p->raw = *f;
    p->epoch = ep;
    if (take_ref) {
        api->incref((shim_pyobj *)f->code);
        p->held = 1;
    }
    shim_hashidx_insert(&frame_index, h, nframes);
    return nframes;
}

#define ENTRY_WORDS (MAX_DEPTH / 64)
#define ENTRY_BIT(entry, i) (((entry)[(i) / 64] >> ((i) % 64)) & 1u)

/* Where a stack goes in the index. Per frame only its code object and
 * offset, in one mix (frame_hash takes four): stack_eq compares every
 * field anyway, and stacks that differ only in the other ones (a code
 * address reused by another function) are too rare to matter to a chain's
 * length. This and the word-wise entry marks in stack_eq pay for the marks
 * and flags that joined the key (issue 12's capture budget). */
static uint64_t stack_hash(const shim_pyrawframe *buf, const uint64_t *entry, unsigned n,
                           uint8_t flags, uint32_t ep)
{
    uint64_t h = mix(0x5EED, n | (uint64_t)flags << 16 | (uint64_t)ep << 32);
    for (unsigned i = 0; i < n; i++)
        h = mix(h, buf[i].code + ((uint64_t)(uint32_t)buf[i].offset << 40));
    for (unsigned i = 0; i < (n + 63) / 64; i++)
        h = mix(h, entry[i]);
#ifdef PYSTACK_TEST_HASH_COLLIDE
    h = 0x5EED;           /* tests: every lookup decided by stack_eq */
#endif
    return h;
}

struct stack_key {
    const shim_pyrawframe *buf;
    const uint64_t *entry;
    unsigned n;
    uint8_t flags;
    uint32_t ep;
};

static uint64_t stack_hash_of(const void *ctx, uint32_t id)
{
    (void)ctx;
    return stacks[id - 1].hash;
}

static bool stack_eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    (void)ctx;
    const struct stack_key *k = key;
    const pstack *s = &stacks[id - 1];
    const unsigned n = k->n;
    if (s->hash != hash || s->depth != n || s->flags != k->flags)
        return false;
    const uint32_t *slots = pool + s->first;
    const shim_pyrawframe *buf = k->buf;
    const uint32_t ep = k->ep;
    /* The entry marks a word at a time: gathered from the slots' top bits,
     * compared with the walk's bitmap (whose bits past n are clear) once
     * per 64 frames rather than bit by bit. Outermost first within a word,
     * so that each mark shifts in at the bottom (two instructions). */
    for (unsigned base = 0; base < n; base += 64) {
        unsigned end = n - base < 64 ? n : base + 64;
        uint64_t marks = 0;
        for (unsigned i = end; i-- > base;) {
            uint32_t slot = slots[i];
            const pframe *f = &frames[POOL_ID(slot) - 1];
            if (f->epoch != ep || !raw_equal(&f->raw, &buf[i]))
                return false;
            marks = marks << 1 | slot >> 31;
        }
        if (marks != k->entry[base / 64])
            return false;
    }
    return true;
}

static shim_hashidx stack_index = SHIM_HASHIDX_INIT(stack_hash_of, stack_eq, NULL, false);

static uint32_t stack_find_locked(uint64_t h, const shim_pyrawframe *buf, const uint64_t *entry,
                                  unsigned n, uint8_t flags, uint32_t ep)
{
    struct stack_key key = {buf, entry, n, flags, ep};
    return shim_hashidx_find(&stack_index, h, &key);
}

static uint32_t stack_add_locked(uint64_t h, const shim_pyrawframe *buf, const uint64_t *entry,
                                 unsigned n, uint8_t flags, uint32_t ep, bool take_refs)
{
    if (!grow((void **)&stacks, &stacks_cap, nstacks + 1, sizeof *stacks, MAX_STACKS) ||
        !grow((void **)&pool, &pool_cap, npool + n, sizeof *pool, MAX_POOL) ||
        !shim_hashidx_reserve(&stack_index, 1)) {
        warn_full_locked();
        return 0;
    }
    for (unsigned i = 0; i < n; i++) {
        uint32_t fid = frame_intern_locked(&buf[i], ep, take_refs);
        if (!fid) {
            warn_full_locked();
            return 0;               /* the frames added stay, unused: bounded */
        }
        pool[npool + i] = fid | (ENTRY_BIT(entry, i) ? POOL_ENTRY : 0);
    }
    pstack *s = &stacks[nstacks++];
    s->flags = flags;
    s->hash = h;
    s->first = npool;
    s->depth = n;
    npool += n;
    shim_hashidx_insert(&stack_index, h, nstacks);
    return nstacks;
}

/* A name or file name as the bytes it stands for (malloc'ed), or NULL. A
 * file name from a non-UTF-8 path holds surrogateescape'd bytes, which
 * PyUnicode_AsUTF8 refuses: those are encoded back as the file system
 * encodes them (PyUnicode_EncodeFSDefault gives the path's own bytes), and
 * the JSON report writes each byte that is not UTF-8 as \udcXX. GIL held,
 * the caller saved the pending exception. */
static char *name_bytes(shim_pyobj *o)
{
    if (!o)
        return NULL;
    const char *s = api->unicode_as_utf8(o);
    if (s)
        return strdup(s);
    api->err_clear();
    if (!api->unicode_encode_fs || !api->bytes_as_string)
        return NULL;
    shim_pyobj *b = api->unicode_encode_fs(o);
    if (!b) {
        api->err_clear();
        return NULL;
    }
    const char *raw = api->bytes_as_string(b);
    char *out = raw ? strdup(raw) : NULL;
    if (!raw)
        api->err_clear();
    api->decref(b);
    return out;
}

/* With the GIL held (can_resolve() was true): names, files and lines of
 * frames ids[0..n) that are not done. Calls Python without stack_lock. */
static void resolve_ids(const uint32_t *ids, size_t n)
{
    uint32_t ep = atomic_load(&epoch);
    for (size_t i = 0; i < n; i++) {
        shim_mutex_lock(&stack_lock);
        pframe f = frames[ids[i] - 1];
        shim_mutex_unlock(&stack_lock);
        if (f.done || f.epoch != ep)
            continue;
        char *function = NULL, *file = NULL;
        int line = 0;
        /* Without a reference, the code object may have died since: look
         * before touching it. */
        if (f.held || shim_pyframes_still_alive(&L, &f.raw)) {
            shim_pyobj *type, *value, *tb;
            api->err_fetch(&type, &value, &tb);
            function = name_bytes((shim_pyobj *)shim_pyframes_name_obj(&L, f.raw.code));
            file = name_bytes((shim_pyobj *)shim_pyframes_file_obj(&L, f.raw.code));
            line = api->code_addr2line((shim_pyobj *)f.raw.code, f.raw.offset);
            api->err_restore(type, value, tb);
        }
        shim_mutex_lock(&stack_lock);
        pframe *p = &frames[ids[i] - 1];
        if (!p->done) {
            p->function = function ? function : UNKNOWN;
            p->file = file ? file : UNKNOWN;
            p->line = line > 0 ? line : 0;
            p->done = 1;
            function = file = NULL;
        }
        shim_mutex_unlock(&stack_lock);
        free(function);
        free(file);
    }
}

static int pending_resolve(void *arg)
{
    (void)arg;
    atomic_store(&resolve_scheduled, false);
    shim_pystack_resolve_all();
    return 0;
}

/* New frames were captured without the GIL, so without a reference: their
 * code objects may die soon (a script's module code does as soon as it
 * ends). Ask the interpreter's main thread to resolve them at its next
 * check for pending calls, with the GIL it then holds; adding a pending
 * call needs neither the GIL nor a thread state. At most one outstanding;
 * the frames are checked for identity then, and if they are not resolved
 * by then they are at report time. */
static void schedule_resolve(void)
{
    if (!api->add_pending_call || atomic_exchange(&resolve_scheduled, true))
        return;
    if (!api->is_initialized() || api->is_finalizing() ||
        api->add_pending_call(pending_resolve, NULL) != 0)
        atomic_store(&resolve_scheduled, false);
}

static uint32_t capture(unsigned max_depth, uint8_t extra_flags);

uint32_t shim_pystack_capture(unsigned max_depth)
{
    return capture(max_depth, 0);
}

uint32_t shim_pystack_capture_origin(unsigned max_depth)
{
    return capture(max_depth, SHIM_PYSTACK_ORIGIN);
}

static uint32_t capture(unsigned max_depth, uint8_t extra_flags)
{
    if (max_depth == 0 || !ready())
        return 0;
    if (atomic_load_explicit(&closed, memory_order_relaxed))
        maybe_reopen();
    bool attached;
    uintptr_t ts = own_tstate(&attached);
    if (!ts)
        return 0;                       /* a thread that never ran Python */
    /* Finalization frees the thread states of threads that are not
     * attached (daemon threads, before 3.12) while their thread-local
     * pointer still holds the old address: from then on, only the
     * attached thread's own frames are read. */
    if (!attached && (api->is_finalizing() || !api->is_initialized()))
        return 0;
    if (max_depth > MAX_DEPTH)
        max_depth = MAX_DEPTH;
    shim_pyrawframe buf[MAX_DEPTH];
    uint64_t entry[ENTRY_WORDS];
    unsigned n;
    shim_pywalk w;
    if (atomic_load_explicit(&verified, memory_order_acquire)) {
        n = shim_pyframes_walk(&L, ts, buf, entry, max_depth, false, &w);
    } else {
        /* Until one checked walk has gone through two frames and ended
         * where a chain ends (the thread state, frame, code and back-link
         * offsets all proven), every read goes through the kernel: a wrong
         * layout costs stacks, not the process. */
        n = shim_pyframes_walk(&L, ts, buf, entry, max_depth, true, &w);
        if (n >= 2 && w.clean)
            atomic_store_explicit(&verified, true, memory_order_release);
    }
    if (n == 0)
        return 0;
    uint32_t ep = atomic_load_explicit(&epoch, memory_order_relaxed);
    uint8_t flags = (w.truncated ? SHIM_PYSTACK_TRUNCATED : 0) |
                    (w.unsure || !w.clean ? SHIM_PYSTACK_UNSURE : 0) | extra_flags;
    uint64_t h = stack_hash(buf, entry, n, flags, ep);
    shim_mutex_lock(&stack_lock);
    bool is_closed = atomic_load(&closed);
    uint32_t id = stack_find_locked(h, buf, entry, n, flags, ep);
    uint32_t new_from = nframes, new_to = nframes;
    if (!id) {
        /* A reference only to the main interpreter's code: a
         * subinterpreter's objects go when it ends, and our Py_DecRef at
         * the main one's finalization would touch freed memory. */
        bool take_refs = attached && !is_closed &&
                         *(void *const *)(ts + L.ts_interp) == (void *)api->interp_main();
        id = stack_add_locked(h, buf, entry, n, flags, ep, take_refs);
        new_to = nframes;
    }
    shim_mutex_unlock(&stack_lock);
    if (new_to > new_from && !attached && !is_closed)
        schedule_resolve();
    /* Past this lifetime's gate (atexit handlers, late allocations) no
     * reference is taken, and nothing would resolve these frames later:
     * resolve them now, while their code objects are certainly alive. */
    if (is_closed && new_to > new_from && attached && api->is_initialized() && !api->is_finalizing()) {
        uint32_t ids[MAX_DEPTH];
        size_t k = 0;
        for (uint32_t fid = new_from + 1; fid <= new_to && k < MAX_DEPTH; fid++)
            ids[k++] = fid;
        resolve_ids(ids, k);
    }
    return id;
}

/* Frame ids of stack `id` (or of every stack when id is 0) that are still
 * to be resolved in the current lifetime; malloc'ed, *n set. */
static uint32_t *pending_locked(uint32_t id, size_t *n)
{
    uint32_t ep = atomic_load(&epoch);
    uint32_t from = 0, to = nframes;
    const uint32_t *list = NULL;
    if (id) {
        list = pool + stacks[id - 1].first;
        to = stacks[id - 1].depth;
    }
    *n = 0;
    uint32_t *out = malloc(((size_t)(to - from) + 1) * sizeof *out);
    if (!out)
        return NULL;
    for (uint32_t i = from; i < to; i++) {
        uint32_t fid = list ? POOL_ID(list[i]) : i + 1;
        const pframe *f = &frames[fid - 1];
        if (!f->done && f->epoch == ep)
            out[(*n)++] = fid;
    }
    return out;
}

size_t shim_pystack_frames(uint32_t id, shim_pyframe *out, size_t max)
{
    if (id == 0)
        return 0;
    bool resolve = can_resolve();
    shim_mutex_lock(&stack_lock);
    if (id > nstacks) {
        shim_mutex_unlock(&stack_lock);
        return 0;
    }
    size_t n = 0;
    uint32_t *todo = resolve ? pending_locked(id, &n) : NULL;
    shim_mutex_unlock(&stack_lock);
    if (todo)
        resolve_ids(todo, n);
    free(todo);

    shim_mutex_lock(&stack_lock);
    const pstack *s = &stacks[id - 1];
    size_t depth = s->depth;
    for (size_t i = 0; i < depth && i < max; i++) {
        uint32_t slot = pool[s->first + i];
        const pframe *f = &frames[POOL_ID(slot) - 1];
        out[i].function = f->done ? f->function : UNKNOWN;
        out[i].file = f->done ? f->file : UNKNOWN;
        out[i].line = f->done ? f->line : 0;
        out[i].entry = (slot & POOL_ENTRY) != 0;
    }
    shim_mutex_unlock(&stack_lock);
    return depth;
}

void shim_pystack_resolve_all(void)
{
    if (!can_resolve())
        return;
    size_t n = 0;
    shim_mutex_lock(&stack_lock);
    uint32_t *todo = pending_locked(0, &n);
    shim_mutex_unlock(&stack_lock);
    if (todo)
        resolve_ids(todo, n);
    free(todo);
}

bool shim_pystack_pending(uint32_t id)
{
    if (id == 0)
        return false;
    size_t n = 0;
    shim_mutex_lock(&stack_lock);
    uint32_t *todo = id <= nstacks ? pending_locked(id, &n) : NULL;
    shim_mutex_unlock(&stack_lock);
    free(todo);
    return n != 0;
}

void shim_pystack_resolve_soon(void)
{
    if (atomic_load_explicit(&state, memory_order_acquire) != ST_READY || atomic_load(&closed))
        return;
    size_t n = 0;
    shim_mutex_lock(&stack_lock);
    uint32_t *todo = pending_locked(0, &n);
    shim_mutex_unlock(&stack_lock);
    free(todo);
    if (n)
        schedule_resolve();
}

uint64_t shim_pystack_resolve_detached(void)
{
    if (atomic_load_explicit(&state, memory_order_acquire) != ST_READY || atomic_load(&closed))
        return 0;
    size_t n = 0;
    shim_mutex_lock(&stack_lock);
    uint32_t *todo = pending_locked(0, &n);
    shim_mutex_unlock(&stack_lock);
    free(todo);
    /* Nothing pending (frames resolved earlier, or none recorded): the
     * program is not stopped at all. */
    if (n == 0 || !api->is_initialized() || api->is_finalizing())
        return 0;
    /* Inside the lifecycle gate, as the GC thread: refused once
     * finalization began, and finalization waits (bounded) for it. */
    enum shim_gate_verdict v = shim_gate_enter(api);
    if (v == SHIM_GATE_REFUSE)
        return 0;
    int g = api->gil_ensure();
    uint64_t t0 = shim_now_ns();
    if (!api->is_finalizing()) {
        if (v == SHIM_GATE_ADMIT_UNARMED)
            shim_gate_arm(api);
        shim_pystack_resolve_all();
    }
    uint64_t ns = shim_now_ns() - t0;
    api->gil_release(g);
    shim_gate_leave();
    return ns ? ns : 1;
}

/* The finalization gate (GIL held, before finalization begins): resolve
 * what this lifetime captured, stop taking references, and give back the
 * ones we hold while the interpreter can still free what they kept. */
static void on_finalize(void)
{
    shim_pystack_resolve_all();
    unsigned long cycle = shim_gate_cycles();
    shim_mutex_lock(&stack_lock);
    atomic_store(&closed_cycle, cycle);
    atomic_store(&closed, true);
    size_t n = 0;
    uintptr_t *codes = malloc(((size_t)nframes + 1) * sizeof *codes);
    for (uint32_t i = 0; codes && i < nframes; i++) {
        if (frames[i].held) {
            frames[i].held = 0;
            codes[n++] = frames[i].raw.code;
        }
    }
    shim_mutex_unlock(&stack_lock);
    for (size_t i = 0; i < n; i++)
        api->decref((shim_pyobj *)codes[i]);
    free(codes);
}

unsigned shim_pystack_flags(uint32_t id)
{
    unsigned flags = 0;
    shim_mutex_lock(&stack_lock);
    if (id && id <= nstacks)
        flags = stacks[id - 1].flags;
    shim_mutex_unlock(&stack_lock);
    return flags;
}

uintptr_t shim_pystack_interpreter_base(void)
{
    return atomic_load_explicit(&state, memory_order_acquire) == ST_UNKNOWN ? 0 : interp_base;
}

uintptr_t shim_pystack_eval_entry(void)
{
    return atomic_load_explicit(&state, memory_order_acquire) == ST_UNKNOWN ? 0 : eval_entry;
}

const char *shim_pystack_note(void)
{
    return atomic_load_explicit(&state, memory_order_acquire) == ST_UNKNOWN ? NULL : off_note;
}
