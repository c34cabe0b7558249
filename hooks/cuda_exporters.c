/* Exporters by calling object (SPYRESHIM_CUDA_IPC_CALLERS): whether the
 * shared object that called cuMemAlloc_v2 is one the user named as a
 * program that exports its buffers (NCCL's legacy transport exports its
 * 4-8 KiB connection structures: libnccl, which carries the CUDA runtime
 * statically, is the caller the driver sees). Its requests then get a
 * region of their own whatever their size (docs/cuda.md, "IPC").
 *
 * Owns: the list of names (parsed once) and a cache of answers by return
 * address: 512 slots, each one word (address << 1 | answer), written and
 * read with relaxed atomics, so that a reader sees either a whole entry or
 * another address's (a miss): no lock. A miss asks dladdr, off the common
 * path (only when the option is set at all: cuda_driver.c does not call
 * here otherwise).
 * Never: allocates after the list is parsed, or calls dlerror(). */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hooks.h"
#include "options.h"

#define SLOTS 512
#define MAX_NAMES 16

static _Atomic uint64_t cache[SLOTS];
static char *names[MAX_NAMES];
static unsigned nnames;

bool shim_cuda_exporters_init(void)
{
    const char *v = shim_opts()->cuda_ipc_callers;
    if (!v || !*v)
        return false;
    char *copy = strdup(v);
    if (!copy)
        return false;
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t && nnames < MAX_NAMES;
         t = strtok_r(NULL, ",", &save))
        if (*t)
            names[nnames++] = t;
    return nnames > 0;
}

/* The object that holds `ret` is named by one of the names (a substring of
 * its path: "libnccl" matches /usr/lib/libnccl.so.2). */
static bool lookup(const void *ret)
{
    Dl_info info;
    if (!dladdr(ret, &info) || !info.dli_fname)
        return false;
    for (unsigned i = 0; i < nnames; i++)
        if (strstr(info.dli_fname, names[i]))
            return true;
    return false;
}

bool shim_cuda_caller_exports(const void *ret)
{
    uint64_t a = (uint64_t)(uintptr_t)ret;
    _Atomic uint64_t *slot = &cache[(a >> 2) % SLOTS];
    uint64_t e = atomic_load_explicit(slot, memory_order_relaxed);
    if (e >> 1 == a)
        return e & 1;
    bool yes = lookup(ret);
    atomic_store_explicit(slot, a << 1 | yes, memory_order_relaxed);
    return yes;
}
