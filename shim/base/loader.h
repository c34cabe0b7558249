/* Every call the shim makes into the dynamic loader. Two rules hold here
 * for every one of them (docs/locking.md):
 * - no shim lock is held by the calling thread (a library constructor that
 *   allocates device memory runs under the loader's lock and waits for
 *   ours): debug builds abort, naming the call, when one is;
 * - the call is inside the fork gate (forkgate.h): a fork never leaves a
 *   child with a loader lock a parent thread held in our call.
 * No other file of the product calls dlopen, dlsym, dlclose,
 * dl_iterate_phdr, dladdr or dlinfo. */
#ifndef SHIM_LOADER_H
#define SHIM_LOADER_H

#include <dlfcn.h>
#include <link.h>

/* Not instrumented by sanitizers: what a sanitizer's runtime calls while it
 * initializes, before instrumented code may run (its dlsym lookups of the
 * real functions, and the sigaction calls that install its handlers, both
 * of which the shim interposes). */
#define SHIM_NO_SANITIZE __attribute__((no_sanitize("thread", "address", "undefined")))

/* dlsym. RTLD_NEXT is relative to the shim's own object, as in a direct
 * call (this file is part of it). */
void *shim_dlsym(void *handle, const char *name);
/* dlopen of an object that is already loaded (RTLD_NOLOAD is added); NULL
 * path: the main program. */
void *shim_dlopen_noload(const char *path, int flags);
/* dlopen that may load: only for the shim's own private helpers
 * (libunwind, libdw), never a runtime or an interpreter. */
void *shim_dlopen(const char *path, int flags);
int shim_dlclose(void *handle);
const char *shim_dlerror(void);
int shim_dl_iterate_phdr(int (*cb)(struct dl_phdr_info *, size_t, void *), void *data);
int shim_dladdr(const void *addr, Dl_info *info);
int shim_dladdr1(const void *addr, Dl_info *info, void **extra, int flags);

/* The check every wrapper makes, for callers that enter the loader in other
 * ways (libunwind's unwinder walks the loaded objects itself). */
void shim_loader_check(const char *what);

#endif
