/* Interposition of a runtime's allocation entry points.
 *
 * Every runtime has the same three roles (allocate, free, memory info), with
 * the shapes of cudaMalloc/cudaFree/cudaMemGetInfo. A runtime's file (one
 * per runtime) lists its entry points once, as a table, and the macros here
 * generate the exported wrappers, the real-function slots and their
 * resolution:
 *
 *     #define ENTRY_POINTS(X) \
 *         X(MALLOC, simdevMalloc) X(FREE, simdevFree) X(MEMINFO, simdevMemGetInfo)
 *     SHIM_HOOK_RUNTIME("simdev", ENTRY_POINTS, 1, 2, 256)
 *
 * No runtime header is needed at build time: the prototypes are ours. */
#ifndef SHIM_HOOKS_H
#define SHIM_HOOKS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include "device.h"

/* Finds the real definition of `name`: the next object after us in the
 * global scope, else an already-loaded object that defines it in a local
 * scope (an extension module and the runtime it depends on are opened
 * RTLD_LOCAL). Never loads anything. NULL when nothing defines it. */
void *shim_resolve_real(const char *name);
/* The C library's dlsym, for the shim's own lookups (dlsym itself is
 * interposed by dlsym.c). */
void *shim_real_dlsym(void *handle, const char *name);
/* dlsym(handle, name) of the program, for a name that may be one a runtime
 * file serves: the shim's function, or NULL to let the C library answer.
 * A runtime file registers one at load time (dlsym.c asks it for
 * lookups on handles other than the special ones, made outside the shim);
 * dlsym.c knows no runtime. */
/* `caller`: the return address of the program's dlsym call (whose
 * object made the lookup). */
typedef void *(*shim_dlsym_lookup_fn)(void *handle, const char *name, const void *caller);
void shim_dlsym_set_lookup(shim_dlsym_lookup_fn fn);
/* Whether the object holding the code address `addr` defines `name`
 * itself (its own symbol table, not its dependencies'): who made a call,
 * e.g. an OpenCL library (dlsym.c). Calls the loader. */
bool shim_object_defines(const void *addr, const char *name);
/* True when `addr` lies inside the shim's own object (self.c). */
bool shim_is_own_address(const void *addr);
/* SPYRESHIM_CUDA_IPC_CALLERS (cuda_exporters.c): parses the names once,
 * true when some are set; then whether the object holding the return
 * address `ret` is one of them (its CUDA allocations may be exported). */
bool shim_cuda_exporters_init(void);
bool shim_cuda_caller_exports(const void *ret);

enum { SHIM_ROLE_MALLOC, SHIM_ROLE_FREE, SHIM_ROLE_MEMINFO, SHIM_ROLES };

typedef struct shim_hook_slots {
    const char *names[SHIM_ROLES];
    shim_runtime rt;
    /* Optional: true when this call must go straight to the real function
     * (the runtime reaches the shim through another route). */
    bool (*pass_through)(void);
    /* Set once everything is resolved; published under the hook
     * resolution lock (shim_device_publish_lock). */
    _Atomic(shim_device *) device;
} shim_hook_slots;

/* Device 0 behind `s`, resolving the real functions on first use; NULL
 * while the runtime cannot be found (the next call tries again). Non-NULL
 * means s->rt is complete. */
shim_device *shim_hook_device_resolve(shim_hook_slots *s);
/* Inline: every intercepted call starts here, and after the first one the
 * device is published. */
static inline shim_device *shim_hook_device(shim_hook_slots *s)
{
    shim_device *d = atomic_load_explicit(&s->device, memory_order_acquire);
    return d ? d : shim_hook_device_resolve(s);
}

#define SHIM_HOOK_NAME_(role, sym) [SHIM_ROLE_##role] = #sym,

#define SHIM_HOOK_PASS_ (slots.pass_through && slots.pass_through())
#define SHIM_HOOK_WRAP_MALLOC(sym)                                                \
    __attribute__((visibility("default"))) int sym(void **ptr, size_t size)       \
    {                                                                             \
        shim_device *d = shim_hook_device(&slots);                                \
        if (!d)                                                                   \
            return slots.rt.err_invalid;                                          \
        if (SHIM_HOOK_PASS_)                                                      \
            return slots.rt.real_malloc(ptr, size);                               \
        if (!slots.rt.current_device) /* one device: the one resolved */          \
            return shim_device_malloc(d, ptr, size);                              \
        return shim_device_malloc_current(&slots.rt, ptr, size);                  \
    }
#define SHIM_HOOK_WRAP_FREE(sym)                                                  \
    __attribute__((visibility("default"))) int sym(void *ptr)                     \
    {                                                                             \
        shim_device *d = shim_hook_device(&slots);                                \
        if (!d)                                                                   \
            return slots.rt.err_invalid;                                          \
        if (SHIM_HOOK_PASS_)                                                      \
            return slots.rt.real_free(ptr);                                       \
        return shim_device_free_any(&slots.rt, d, ptr);                           \
    }
#define SHIM_HOOK_WRAP_MEMINFO(sym)                                               \
    __attribute__((visibility("default"))) int sym(size_t *free, size_t *total)  \
    {                                                                             \
        shim_device *d = shim_hook_device(&slots);                                \
        if (!d)                                                                   \
            return slots.rt.err_invalid;                                          \
        if (SHIM_HOOK_PASS_)                                                      \
            return slots.rt.real_mem_info(free, total);                           \
        if (!slots.rt.current_device)                                             \
            return shim_device_mem_info(d, free, total);                          \
        return shim_device_mem_info_current(&slots.rt, free, total);              \
    }
#define SHIM_HOOK_WRAP_(role, sym) SHIM_HOOK_WRAP_##role(sym)

/* One per runtime file: the slots (named `slots`) and the wrappers.
 * SHIM_HOOK_RUNTIME_EX adds the optional parts of shim_runtime (current
 * device, waiting for a device) and the pass-through test. */
#define SHIM_HOOK_RUNTIME_EX(label, ENTRY_POINTS, einval, eoom, align, curdev, sync, pass) \
    static shim_hook_slots slots = {                                              \
        .names = {ENTRY_POINTS(SHIM_HOOK_NAME_)},                                 \
        .rt = {.name = label, .err_invalid = einval, .err_oom = eoom,            \
               .alignment = align, .current_device = curdev, .sync_device = sync}, \
        .pass_through = pass,                                                     \
    };                                                                            \
    ENTRY_POINTS(SHIM_HOOK_WRAP_)
#define SHIM_HOOK_RUNTIME(label, ENTRY_POINTS, einval, eoom, align)               \
    SHIM_HOOK_RUNTIME_EX(label, ENTRY_POINTS, einval, eoom, align, NULL, NULL, NULL)

#endif
