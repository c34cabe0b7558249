/* The garbage-collection policy: for a device allocation that failed, who
 * called the runtime, and where a collection may run for that caller
 * (inline, on the shim's GC thread, or not at all). The one table of it is
 * here; docs/frameworks.md gives the evidence for every row.
 *
 * Why: a framework's allocator may hold its own lock across the driver
 * call. A collection on the shim's thread then runs finalizers whose free
 * waits for that lock, which the waiting caller holds (a stall until
 * SPYRESHIM_GC_TIMEOUT_MS); inline, under a plain (non-recursive) mutex, it
 * deadlocks the thread on itself. Such callers get out-of-memory at once,
 * and the framework's own release-and-retry (and its hook: the presets of
 * the Python package) does the rest.
 *
 * Owns: the mode and the configuration read at init (written once by the
 * constructor, read-only after). No lock. Runs on the failure path only,
 * with no shim lock held: it unwinds (glibc's backtrace, inside the fork
 * gate) and asks the loader (shim_dladdr) who owns each frame. Never called on the fast path.
 * Must never take a lock of the allocator or call into Python. */
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>

#include "forkgate.h"
#include "loader.h"
#include "options.h"
#include "policy.h"

/* Which lock the caller's allocator holds across the driver call. */
enum lock_held {
    HELD_UNKNOWN,    /* not a framework we know: today's behaviour */
    HELD_NONE,       /* no lock: a collection anywhere is safe */
    HELD_RECURSIVE,  /* a recursive mutex: its own free may re-enter it on this thread only */
    HELD_PLAIN,      /* a plain mutex: its free deadlocks on this thread, stalls on another */
};

/* The table: an object, by a piece of its path, and what its allocator
 * holds at the driver call in its default configuration. First match wins
 * (cupy_backends before cuda/bindings). */
static const struct caller_row {
    const char *path_part;        /* matched against the object's full path */
    bool basename_prefix;         /* true: the object's file name starts with it */
    enum shim_gc_caller caller;
    enum lock_held held;
} callers[] = {
    /* PyTorch caching allocator: DeviceCachingAllocator::mutex, a
     * std::recursive_mutex, across alloc_block -> cudaMalloc. */
    {"libc10_cuda.so", true, SHIM_GC_CALLER_TORCH, HELD_RECURSIVE},
    /* CuPy: the pool's arena mutex is released before cudaMalloc (nogil). */
    {"/cupy_backends/", false, SHIM_GC_CALLER_CUPY, HELD_NONE},
    {"/cupy/", false, SHIM_GC_CALLER_CUPY, HELD_NONE},
    /* numba: pending deallocations are a lock-free deque. */
    {"/numba/", false, SHIM_GC_CALLER_NUMBA, HELD_NONE},
    {"/numba_cuda/", false, SHIM_GC_CALLER_NUMBA, HELD_NONE},
    /* cuda.bindings (cuda-python) calls the driver with the GIL released
     * and holds no lock of its own. */
    {"/cuda/bindings/", false, SHIM_GC_CALLER_CUDA_BINDINGS, HELD_NONE},
    /* XLA's BFC allocator: absl::Mutex (not re-entrant) across Extend. */
    {"/jaxlib/", false, SHIM_GC_CALLER_JAX, HELD_PLAIN},
    {"xla_extension", true, SHIM_GC_CALLER_JAX, HELD_PLAIN},
    /* RMM's pool: std::mutex across expand_pool -> upstream cudaMalloc. */
    {"librmm.so", true, SHIM_GC_CALLER_RMM, HELD_PLAIN},
    {"/rmm/", false, SHIM_GC_CALLER_RMM, HELD_PLAIN},
    /* NCCL allocates its buffers inside communicator setup, under the
     * caller's and its own locks; nothing Python frees gives them back. */
    {"libnccl.so", true, SHIM_GC_CALLER_NCCL, HELD_PLAIN},
};

/* What each lock allows: [held][free_threaded]. On a free-threaded build
 * an inline collection stops the world: a thread holding a framework lock
 * that another attached thread waits for never sees it end, so inline only
 * where no framework lock is held. */
static const enum shim_gc_way ways[4][2] = {
    [HELD_UNKNOWN]   = {SHIM_GC_WAY_TODAY, SHIM_GC_WAY_TODAY},
    [HELD_NONE]      = {SHIM_GC_WAY_TODAY, SHIM_GC_WAY_TODAY},
    [HELD_RECURSIVE] = {SHIM_GC_WAY_INLINE, SHIM_GC_WAY_NONE},
    [HELD_PLAIN]     = {SHIM_GC_WAY_NONE, SHIM_GC_WAY_NONE},
};

static const char *const caller_names[SHIM_GC_CALLER_COUNT] = {
    [SHIM_GC_CALLER_UNKNOWN] = "unknown",
    [SHIM_GC_CALLER_TORCH] = "torch",
    [SHIM_GC_CALLER_CUPY] = "cupy",
    [SHIM_GC_CALLER_NUMBA] = "numba",
    [SHIM_GC_CALLER_CUDA_BINDINGS] = "cuda.bindings",
    [SHIM_GC_CALLER_JAX] = "jax",
    [SHIM_GC_CALLER_RMM] = "rmm",
    [SHIM_GC_CALLER_NCCL] = "nccl",
};

/* Configurations that take the lock away from the driver call (read once
 * at init: the presets set them before the program starts). */
static bool torch_lock_free;  /* uncached, or release_lock_on_cudamalloc:True */
static bool jax_platform;     /* XLA_PYTHON_CLIENT_ALLOCATOR=platform */
static unsigned mode;         /* enum shim_gc_mode */

const char *shim_gc_caller_name(enum shim_gc_caller c)
{
    return (unsigned)c < SHIM_GC_CALLER_COUNT ? caller_names[c] : "unknown";
}

static bool env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

void shim_gc_policy_init(void)
{
    mode = shim_opts()->gc_mode;
    torch_lock_free = env_is("PYTORCH_NO_CUDA_MEMORY_CACHING", "1");
    const char *conf = getenv("PYTORCH_CUDA_ALLOC_CONF");
    if (conf && strstr(conf, "release_lock_on_cudamalloc:True"))
        torch_lock_free = true;
    jax_platform = env_is("XLA_PYTHON_CLIENT_ALLOCATOR", "platform");
}

/* The driver's and the runtime's own objects: frames in them are skipped
 * (the CUDA runtime reaches the driver's cuMemAlloc_v2 through them). */
static bool is_runtime_object(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strncmp(base, "libcuda.so", 10) == 0 || strncmp(base, "libcudart", 9) == 0;
}

static const struct caller_row *classify(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < sizeof callers / sizeof callers[0]; i++) {
        const struct caller_row *r = &callers[i];
        if (r->basename_prefix ? strncmp(base, r->path_part, strlen(r->path_part)) == 0
                               : strstr(path, r->path_part) != NULL)
            return r;
    }
    return NULL;
}

/* The first frame outside the shim, the driver and the runtime. */
static enum lock_held find_caller(enum shim_gc_caller *caller)
{
    *caller = SHIM_GC_CALLER_UNKNOWN;
    Dl_info self;
    if (!shim_dladdr((const void *)find_caller, &self))
        return HELD_UNKNOWN;
    void *pcs[64];
    /* glibc's unwinder walks the loaded objects (and loads libgcc_s on its
     * first use): the loader's rules, and inside the fork gate. */
    shim_loader_check("backtrace");
    shim_fork_gate_enter();
    int n = backtrace(pcs, 64);
    shim_fork_gate_leave();
    for (int i = 0; i < n; i++) {
        Dl_info di;
        /* A return address: the call is the byte before it. */
        if (!shim_dladdr((const char *)pcs[i] - 1, &di) || !di.dli_fname)
            return HELD_UNKNOWN;
        if (di.dli_fbase == self.dli_fbase || is_runtime_object(di.dli_fname))
            continue;
        const struct caller_row *r = classify(di.dli_fname);
        if (!r)
            return HELD_UNKNOWN;
        *caller = r->caller;
        if (r->caller == SHIM_GC_CALLER_TORCH && torch_lock_free)
            return HELD_NONE;
        if (r->caller == SHIM_GC_CALLER_JAX && jax_platform)
            return HELD_NONE;
        return r->held;
    }
    return HELD_UNKNOWN;
}

enum shim_gc_way shim_gc_policy_decide(bool free_threaded, enum shim_gc_caller *caller)
{
    *caller = SHIM_GC_CALLER_UNKNOWN;
    switch (mode) {
    case SHIM_GC_MODE_INLINE:
        return SHIM_GC_WAY_INLINE;
    case SHIM_GC_MODE_THREAD:
        return SHIM_GC_WAY_THREAD;
    case SHIM_GC_MODE_OFF:
        return SHIM_GC_WAY_NONE;
    default:
        break;
    }
    enum lock_held held = find_caller(caller);
    return ways[held][free_threaded ? 1 : 0];
}
