/* Where a collection for a failing device allocation may run, decided per
 * failing call from who made it (docs/frameworks.md). See policy.c. */
#ifndef SHIM_GC_POLICY_H
#define SHIM_GC_POLICY_H

#include <stdbool.h>

/* What a pressure event may do for the calling thread. */
enum shim_gc_way {
    SHIM_GC_WAY_TODAY,   /* inline when attached to Python, else on the GC thread */
    SHIM_GC_WAY_INLINE,  /* inline when attached; a detached caller gets no collection */
    SHIM_GC_WAY_THREAD,  /* on the GC thread (an attached caller detaches to wait) */
    SHIM_GC_WAY_NONE,    /* no collection in the call: out-of-memory at once */
};

/* The caller's framework, as the first frame outside the driver, the
 * runtime and the shim names it. */
enum shim_gc_caller {
    SHIM_GC_CALLER_UNKNOWN,
    SHIM_GC_CALLER_TORCH,
    SHIM_GC_CALLER_CUPY,
    SHIM_GC_CALLER_NUMBA,
    SHIM_GC_CALLER_CUDA_BINDINGS,
    SHIM_GC_CALLER_JAX,
    SHIM_GC_CALLER_RMM,
    SHIM_GC_CALLER_NCCL,
    SHIM_GC_CALLER_COUNT
};

/* From shim_pygc_init (the library constructor): reads SPYRESHIM_GC's mode
 * and the frameworks' own configuration variables that change what lock
 * they hold at the driver call (PYTORCH_NO_CUDA_MEMORY_CACHING,
 * PYTORCH_CUDA_ALLOC_CONF, XLA_PYTHON_CLIENT_ALLOCATOR), once. */
void shim_gc_policy_init(void);

/* The decision for the calling thread's failing allocation. Failure path
 * only: it unwinds the stack (backtrace) and asks the loader who owns each
 * frame (dladdr), so NO shim lock may be held (loader.h). `free_threaded`:
 * the interpreter has no GIL (inline collection stops the world). */
enum shim_gc_way shim_gc_policy_decide(bool free_threaded, enum shim_gc_caller *caller);

/* The caller's name as docs/frameworks.md writes it ("torch", ...). */
const char *shim_gc_caller_name(enum shim_gc_caller c);

#endif
