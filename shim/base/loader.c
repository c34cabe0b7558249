/* The one gateway to the dynamic loader (loader.h).
 *
 * Owns nothing: each wrapper checks the calling thread's count of shim
 * locks (mutex.c) and runs the call inside the fork gate (forkgate.c).
 * Must never be called with a shim lock held: that is what it checks. The
 * check is an abort in debug builds (NDEBUG is set in release builds only)
 * because a loader call under one of our locks is a deadlock waiting for
 * the wrong library constructor, not something to recover from. */
#include <stdlib.h>

#include "forkgate.h"
#include "loader.h"
#include "log.h"
#include "mutex.h"

void shim_loader_check(const char *what)
{
#ifndef NDEBUG
    unsigned n = shim_locks_held();
    if (n) {
        shim_log(SHIM_LOG_WARN, "internal error: %s called with %u shim lock(s) held "
                 "(docs/locking.md: no lock of ours across a loader call)", what, n);
        abort();
    }
#else
    (void)what;
#endif
}

void *shim_dlsym(void *handle, const char *name)
{
    shim_loader_check("dlsym");
    shim_fork_gate_enter();
    void *p = dlsym(handle, name);
    shim_fork_gate_leave();
    return p;
}

void *shim_dlopen_noload(const char *path, int flags)
{
    shim_loader_check("dlopen");
    shim_fork_gate_enter();
    void *h = dlopen(path, flags | RTLD_NOLOAD);
    shim_fork_gate_leave();
    return h;
}

void *shim_dlopen(const char *path, int flags)
{
    shim_loader_check("dlopen");
    shim_fork_gate_enter();
    void *h = dlopen(path, flags);
    shim_fork_gate_leave();
    return h;
}

int shim_dlclose(void *handle)
{
    shim_loader_check("dlclose");
    shim_fork_gate_enter();
    int rc = dlclose(handle);
    shim_fork_gate_leave();
    return rc;
}

const char *shim_dlerror(void)
{
    /* Thread-local state only: no loader lock, no gate. */
    return dlerror();
}

int shim_dl_iterate_phdr(int (*cb)(struct dl_phdr_info *, size_t, void *), void *data)
{
    shim_loader_check("dl_iterate_phdr");
    shim_fork_gate_enter();
    int rc = dl_iterate_phdr(cb, data);
    shim_fork_gate_leave();
    return rc;
}

int shim_dladdr(const void *addr, Dl_info *info)
{
    shim_loader_check("dladdr");
    shim_fork_gate_enter();
    int rc = dladdr(addr, info);
    shim_fork_gate_leave();
    return rc;
}

int shim_dladdr1(const void *addr, Dl_info *info, void **extra, int flags)
{
    shim_loader_check("dladdr1");
    shim_fork_gate_enter();
    int rc = dladdr1(addr, info, extra, flags);
    shim_fork_gate_leave();
    return rc;
}
