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
 * Resolution calls Python (PyCode_Addr2Line, PyUnicode_AsUTF8) only with
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
 * stacks are not recorded (id 0) and one warning says so. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "find.h"
#include "gate.h"
#include "log.h"
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
} pstack;

/* Interpreter entry points, resolved once. Prototypes written by hand from
 * the C API documentation: no Python headers at build time. */
typedef struct pyapi {
    void *(*gilstate_tstate)(void);          /* PyGILState_GetThisThreadState */
    void *(*current_tstate)(void);           /* PyThreadState_GetUnchecked / _PyThreadState_UncheckedGet */
    void (*incref)(void *);
    void (*decref)(void *);
    int (*addr2line)(void *code, int offset);
    const char *(*as_utf8)(void *unicode);
    int (*is_initialized)(void);
    int (*is_finalizing)(void);
    void (*err_fetch)(void **, void **, void **);
    void (*err_restore)(void *, void *, void *);
    int (*add_pending_call)(int (*fn)(void *), void *arg);   /* optional */
    void *(*main_interp)(void);              /* PyInterpreterState_Main */
} pyapi;

enum { ST_UNKNOWN = 0, ST_READY, ST_OFF };

static pthread_mutex_t stack_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int state = ST_UNKNOWN;
static _Atomic bool verified;         /* a checked walk agreed with the layout */
static _Atomic bool closed;           /* this lifetime's finalization gate ran */
static _Atomic unsigned long closed_cycle; /* shim_gate_cycles() when it ran */
static _Atomic bool resolve_scheduled;    /* a pending call will resolve frames */
static _Atomic uint32_t epoch = 1;
static shim_pylayout L;
static pyapi api;
static bool full_warned;

/* Guarded by stack_lock. */
static pframe *frames;
static uint32_t nframes, frames_cap;
static uint32_t *frame_index;         /* open addressing: frame id + 1, 0 empty */
static uint32_t frame_index_cap;
static pstack *stacks;
static uint32_t nstacks, stacks_cap;
static uint32_t *stack_index;         /* stack id (index + 1), 0 empty */
static uint32_t stack_index_cap;
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

void shim_pystack_atfork_prepare(void) { shim_mutex_lock(&stack_lock); }
void shim_pystack_atfork_parent(void) { shim_mutex_unlock(&stack_lock); }
void shim_pystack_atfork_child(void) { shim_mutex_unlock(&stack_lock); }

static void on_finalize(void);

#define SYM(field, name) ((*(void **)&a.field = shim_python_sym(py, name)) != NULL)

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
    pyapi a;
    const char *why = NULL;
    int result = ST_READY;
    if (shim_pyframes_layout(py, &l, true, &why) != 0) {
        if (py->kind == SHIM_PY_CPYTHON)
            shim_warn("Python stacks off for CPython %d.%d: %s", py->major, py->minor, why);
        else
            shim_debug("Python stacks off: %s", why);
        result = ST_OFF;
    } else {
        bool ok = SYM(gilstate_tstate, "PyGILState_GetThisThreadState");
        ok &= SYM(current_tstate, "PyThreadState_GetUnchecked") ||
              SYM(current_tstate, "_PyThreadState_UncheckedGet");
        ok &= SYM(incref, "Py_IncRef");
        ok &= SYM(decref, "Py_DecRef");
        ok &= SYM(addr2line, "PyCode_Addr2Line");
        ok &= SYM(as_utf8, "PyUnicode_AsUTF8");
        ok &= SYM(is_initialized, "Py_IsInitialized");
        ok &= SYM(is_finalizing, "Py_IsFinalizing") || SYM(is_finalizing, "_Py_IsFinalizing");
        ok &= SYM(err_fetch, "PyErr_Fetch");
        ok &= SYM(err_restore, "PyErr_Restore");
        ok &= SYM(main_interp, "PyInterpreterState_Main");
        (void)SYM(add_pending_call, "Py_AddPendingCall");
        if (!ok) {
            shim_warn("Python stacks off: a C API function is missing from %s",
                      py->path ? py->path : "the interpreter");
            result = ST_OFF;
        }
    }
    bool first = false;
    shim_mutex_lock(&stack_lock);
    if (atomic_load(&state) == ST_UNKNOWN) {
        L = l;
        api = a;
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
 * is attached to it (holds the GIL). From 3.12 the current thread state is
 * thread-local, set exactly while attached. Before, it is process-wide
 * (another thread's while we wait), and ours is current only while we
 * hold the GIL. A thread that released the GIL keeps its thread state in
 * PyGILState's thread-local slot, with its frame chain intact. */
static inline uintptr_t own_tstate(bool *attached)
{
    void *cur = api.current_tstate();
    if (L.minor >= 12) {
        *attached = cur != NULL;
        return (uintptr_t)(cur ? cur : api.gilstate_tstate());
    }
    void *own = api.gilstate_tstate();
    *attached = own != NULL && cur == own;
    return (uintptr_t)own;
}

/* Interpreter initialized, not finalizing, this lifetime's gate not yet
 * run, and the caller holds the GIL: Python objects may be used. */
static bool can_resolve(void)
{
    if (atomic_load_explicit(&state, memory_order_acquire) != ST_READY || atomic_load(&closed))
        return false;
    if (!api.is_initialized() || api.is_finalizing())
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
    if (shim_gate_cycles() == atomic_load(&closed_cycle) || !api.is_initialized() ||
        api.is_finalizing())
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

/* Rebuilds an index at twice the size, so that it stays under half full. */
static bool index_rehash(uint32_t **index, uint32_t *cap, uint32_t count,
                         uint64_t (*hash_of)(uint32_t id))
{
    if ((uint64_t)(count + 1) * 2 <= *cap)
        return true;
    uint32_t c = *cap ? *cap * 2 : 256;
    uint32_t *ix = calloc(c, sizeof *ix);
    if (!ix)
        return false;
    for (uint32_t id = 1; id <= count; id++) {
        uint32_t at = (uint32_t)hash_of(id) & (c - 1);
        while (ix[at])
            at = (at + 1) & (c - 1);
        ix[at] = id;
    }
    free(*index);
    *index = ix;
    *cap = c;
    return true;
}

static uint64_t frame_hash_of(uint32_t id)
{
    return frame_hash(&frames[id - 1].raw, frames[id - 1].epoch);
}

static uint64_t stack_hash_of(uint32_t id)
{
    return stacks[id - 1].hash;
}

/* The id (index + 1) of frame `f` of lifetime `ep`, added when new (with a
 * reference to its code object when `take_ref`). 0 when the table is full. */
static uint32_t frame_intern_locked(const shim_pyrawframe *f, uint32_t ep, bool take_ref)
{
    uint64_t h = frame_hash(f, ep);
    if (frame_index_cap) {
        for (uint32_t at = (uint32_t)h & (frame_index_cap - 1);; at = (at + 1) & (frame_index_cap - 1)) {
            uint32_t id = frame_index[at];
            if (!id)
                break;
            if (frames[id - 1].epoch == ep && raw_equal(&frames[id - 1].raw, f))
                return id;
        }
    }
    if (!grow((void **)&frames, &frames_cap, nframes + 1, sizeof *frames, MAX_FRAMES) ||
        !index_rehash(&frame_index, &frame_index_cap, nframes, frame_hash_of))
        return 0;
    pframe *p = &frames[nframes++];
    memset(p, 0, sizeof *p);
    p->raw = *f;
    p->epoch = ep;
    if (take_ref) {
        api.incref((void *)f->code);
        p->held = 1;
    }
    uint32_t at = (uint32_t)h & (frame_index_cap - 1);
    while (frame_index[at])
        at = (at + 1) & (frame_index_cap - 1);
    frame_index[at] = nframes;
    return nframes;
}

static uint64_t stack_hash(const shim_pyrawframe *buf, unsigned n, uint32_t ep)
{
    uint64_t h = mix(0x5EED, n);
    for (unsigned i = 0; i < n; i++)
        h = mix(h, frame_hash(&buf[i], ep));
    return h;
}

static uint32_t stack_find_locked(uint64_t h, const shim_pyrawframe *buf, unsigned n, uint32_t ep)
{
    if (!stack_index_cap)
        return 0;
    for (uint32_t at = (uint32_t)h & (stack_index_cap - 1);; at = (at + 1) & (stack_index_cap - 1)) {
        uint32_t id = stack_index[at];
        if (!id)
            return 0;
        const pstack *s = &stacks[id - 1];
        if (s->hash != h || s->depth != n)
            continue;
        unsigned i = 0;
        for (; i < n; i++) {
            const pframe *f = &frames[pool[s->first + i] - 1];
            if (f->epoch != ep || !raw_equal(&f->raw, &buf[i]))
                break;
        }
        if (i == n)
            return id;
    }
}

static uint32_t stack_add_locked(uint64_t h, const shim_pyrawframe *buf, unsigned n, uint32_t ep,
                                 bool take_refs)
{
    if (!grow((void **)&stacks, &stacks_cap, nstacks + 1, sizeof *stacks, MAX_STACKS) ||
        !grow((void **)&pool, &pool_cap, npool + n, sizeof *pool, MAX_POOL) ||
        !index_rehash(&stack_index, &stack_index_cap, nstacks, stack_hash_of)) {
        warn_full_locked();
        return 0;
    }
    for (unsigned i = 0; i < n; i++) {
        uint32_t fid = frame_intern_locked(&buf[i], ep, take_refs);
        if (!fid) {
            warn_full_locked();
            return 0;               /* the frames added stay, unused: bounded */
        }
        pool[npool + i] = fid;
    }
    pstack *s = &stacks[nstacks++];
    s->hash = h;
    s->first = npool;
    s->depth = n;
    npool += n;
    uint32_t at = (uint32_t)h & (stack_index_cap - 1);
    while (stack_index[at])
        at = (at + 1) & (stack_index_cap - 1);
    stack_index[at] = nstacks;
    return nstacks;
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
            void *type, *value, *tb;
            api.err_fetch(&type, &value, &tb);
            const char *s = api.as_utf8((void *)shim_pyframes_name_obj(&L, f.raw.code));
            function = s ? strdup(s) : NULL;
            s = api.as_utf8((void *)shim_pyframes_file_obj(&L, f.raw.code));
            file = s ? strdup(s) : NULL;
            line = api.addr2line((void *)f.raw.code, f.raw.offset);
            api.err_restore(type, value, tb);
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
    if (!api.add_pending_call || atomic_exchange(&resolve_scheduled, true))
        return;
    if (!api.is_initialized() || api.is_finalizing() ||
        api.add_pending_call(pending_resolve, NULL) != 0)
        atomic_store(&resolve_scheduled, false);
}

uint32_t shim_pystack_capture(unsigned max_depth)
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
    if (!attached && (api.is_finalizing() || !api.is_initialized()))
        return 0;
    if (max_depth > MAX_DEPTH)
        max_depth = MAX_DEPTH;
    shim_pyrawframe buf[MAX_DEPTH];
    unsigned n;
    bool clean;
    if (atomic_load_explicit(&verified, memory_order_acquire)) {
        n = shim_pyframes_walk(&L, ts, buf, max_depth, false, &clean);
    } else {
        /* Until one checked walk has gone through two frames and ended
         * where a chain ends (the thread state, frame, code and back-link
         * offsets all proven), every read goes through the kernel: a wrong
         * layout costs stacks, not the process. */
        n = shim_pyframes_walk(&L, ts, buf, max_depth, true, &clean);
        if (n >= 2 && clean)
            atomic_store_explicit(&verified, true, memory_order_release);
    }
    if (n == 0)
        return 0;
    uint32_t ep = atomic_load_explicit(&epoch, memory_order_relaxed);
    uint64_t h = stack_hash(buf, n, ep);
    shim_mutex_lock(&stack_lock);
    bool is_closed = atomic_load(&closed);
    uint32_t id = stack_find_locked(h, buf, n, ep);
    uint32_t new_from = nframes, new_to = nframes;
    if (!id) {
        /* A reference only to the main interpreter's code: a
         * subinterpreter's objects go when it ends, and our Py_DecRef at
         * the main one's finalization would touch freed memory. */
        bool take_refs = attached && !is_closed &&
                         *(void *const *)(ts + L.ts_interp) == api.main_interp();
        id = stack_add_locked(h, buf, n, ep, take_refs);
        new_to = nframes;
    }
    shim_mutex_unlock(&stack_lock);
    if (new_to > new_from && !attached && !is_closed)
        schedule_resolve();
    /* Past this lifetime's gate (atexit handlers, late allocations) no
     * reference is taken, and nothing would resolve these frames later:
     * resolve them now, while their code objects are certainly alive. */
    if (is_closed && new_to > new_from && attached && api.is_initialized() && !api.is_finalizing()) {
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
        uint32_t fid = list ? list[i] : i + 1;
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
        const pframe *f = &frames[pool[s->first + i] - 1];
        out[i].function = f->done ? f->function : UNKNOWN;
        out[i].file = f->done ? f->file : UNKNOWN;
        out[i].line = f->done ? f->line : 0;
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
        api.decref((void *)codes[i]);
    free(codes);
}
