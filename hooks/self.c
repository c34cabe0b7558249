/* The shim's own object: whether an address (a function another lookup
 * returned, a caller's return address) lies inside libspyreshim.so. The
 * one answer for the hooks: resolve.c skips the shim's own definitions when
 * it looks for a runtime's real ones, cuda_driver.c when it learns the
 * driver's, dlsym.c leaves the shim's own lookups alone.
 *
 * Owns the shim's load address, looked up once with dladdr and kept in an
 * atomic (racing first callers store the same value). No lock; a loader
 * call (dladdr) per question, through loader.h. */
#include <dlfcn.h>
#include <stdatomic.h>

#include "hooks.h"
#include "loader.h"

bool shim_is_own_address(const void *addr)
{
    static _Atomic(void *) self_base;
    void *base = atomic_load_explicit(&self_base, memory_order_relaxed);
    if (!base) {
        Dl_info self;
        if (!shim_dladdr((const void *)shim_is_own_address, &self))
            return false;
        base = self.dli_fbase;
        atomic_store_explicit(&self_base, base, memory_order_relaxed);
    }
    Dl_info di;
    return addr && shim_dladdr(addr, &di) && di.dli_fbase == base;
}
