/* dlsym interposition: a lookup on a handle (numba and other ctypes users
 * look driver functions up this way, `_v2` first) is offered to the lookup
 * a runtime file registered (hooks/cuda_driver.c: the shim's wrapper of a
 * served driver function); every other lookup behaves exactly as before.
 * This file knows no runtime: the runtime file above registers itself.
 *
 * The entry point itself is dlsym_x86_64.S: glibc resolves RTLD_NEXT (and
 * records the caller for dlerror) from dlsym's return address, so a C
 * wrapper that calls the real dlsym would make every other object's
 * RTLD_NEXT lookups relative to the shim. The stub asks shim_dlsym_pick
 * and, when it answers NULL, jumps to the real dlsym with the caller's
 * return address still on the stack. The definition is unversioned: it
 * then satisfies references to both of glibc's versions (GLIBC_2.2.5 and
 * GLIBC_2.34); a version node of its own would silently stop the
 * interposition. Never calls dlerror(): callers read it after a failed
 * lookup (LLVM inside numba crashes when it finds it cleared). No lock. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "forkgate.h"
#include "hooks.h"
#include "loader.h"
#include "log.h"

/* Read by the stub's tail jump: never NULL once shim_dlsym_pick returned. */
__attribute__((visibility("hidden"))) void *(*_Atomic shim_dlsym_next)(void *, const char *);

/* Not instrumented by sanitizers: a sanitizer's runtime looks its real
 * functions up with dlsym while it initializes, before instrumented code
 * may run, and those lookups come through here. */
#define NO_SANITIZE __attribute__((no_sanitize("thread", "address", "undefined")))

NO_SANITIZE static void *(*resolve_next(void))(void *, const char *)
{
    void *(*fn)(void *, const char *) = atomic_load_explicit(&shim_dlsym_next, memory_order_acquire);
    if (fn)
        return fn;
    /* dlvsym is not interposed; RTLD_NEXT from here is libc's dlsym. */
    *(void **)&fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (!fn)
        *(void **)&fn = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (!fn)
        abort(); /* no glibc dlsym: nothing can work (nothing to log with yet) */
    atomic_store_explicit(&shim_dlsym_next, fn, memory_order_release);
    return fn;
}

void *shim_real_dlsym(void *handle, const char *name)
{
    void *(*next)(void *, const char *) = resolve_next();
    /* The rules of every loader call of the shim (shim/base/loader.h). */
    shim_loader_check("dlsym");
    shim_fork_gate_enter();
    void *p = next(handle, name);
    shim_fork_gate_leave();
    return p;
}

/* The registered lookup (NULL: none yet); set once, at load time. */
static _Atomic(shim_dlsym_lookup_fn) lookup;

void shim_dlsym_set_lookup(shim_dlsym_lookup_fn fn)
{
    atomic_store_explicit(&lookup, fn, memory_order_release);
}

/* A lookup of a name that may be one the shim serves. */
static void *pick_served(void *handle, const char *name, void *ret)
{
    shim_dlsym_lookup_fn fn = atomic_load_explicit(&lookup, memory_order_acquire);
    if (!fn || shim_is_own_address(ret))
        return NULL; /* the shim looking for the real function */
    return fn(handle, name);
}

/* From the stub, with dlsym's arguments and its caller's return address.
 * NULL: the stub forwards the call untouched. */
NO_SANITIZE __attribute__((visibility("hidden"))) void *shim_dlsym_pick(void *handle,
                                                                        const char *name,
                                                                        void *ret)
{
    resolve_next();
    /* The special handles are relative to the caller or global: the global
     * scope already finds the shim's exports first, and RTLD_NEXT must stay
     * the caller's. The fast test on the name keeps everything else cheap
     * (and out of instrumented code). */
    if (!name || handle == RTLD_NEXT || handle == RTLD_DEFAULT || name[0] != 'c' || name[1] != 'u')
        return NULL;
    return pick_served(handle, name, ret);
}
