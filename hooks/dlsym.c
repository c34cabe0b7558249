/* dlsym interposition: a lookup on a handle (numba and other ctypes users
 * look driver functions up this way, `_v2` first) is offered to the lookups
 * the runtime files registered (hooks/cuda_driver.c, hooks/opencl_routes.c: the
 * shim's wrapper of a served function); every other lookup behaves exactly
 * as before. This file knows no runtime: the runtime files register
 * themselves.
 *
 * The entry point itself is dlsym_x86_64.S: glibc resolves RTLD_NEXT (and
 * records the caller for dlerror) from dlsym's return address, so a C
 * wrapper that calls the real dlsym would make every other object's
 * RTLD_NEXT lookups relative to the shim. The stub asks shim_dlsym_pick
 * and, when it answers NULL, jumps to the real dlsym with the caller's
 * return address still on the stack. The definition is unversioned: it
 * then satisfies references to both of glibc's versions (GLIBC_2.2.5 and
 * GLIBC_2.34); a version node of its own would silently stop the
 * interposition. dlvsym is interposed the same way (dlvsym stub,
 * shim_dlvsym_pick). Never calls dlerror(): callers read it after a failed
 * lookup (LLVM inside numba crashes when it finds it cleared). No lock.
 * The C library's dlsym and dlvsym are read from its symbol table at the
 * first lookup, with no loader call (that lookup may be a sanitizer's,
 * before anything is set up). */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "forkgate.h"
#include "hooks.h"
#include "loader.h"
#include "log.h"

/* Read by the stubs' tail jumps: never NULL once shim_dlsym_pick (or
 * shim_dlvsym_pick) returned. */
__attribute__((visibility("hidden"))) void *(*_Atomic shim_dlsym_next)(void *, const char *);
__attribute__((visibility("hidden"))) void *(*_Atomic shim_dlvsym_next)(void *, const char *,
                                                                        const char *);

/* SHIM_NO_SANITIZE (loader.h): a sanitizer's runtime looks its real
 * functions up with dlsym while it initializes, through here. */

/* The C library's own dlsym and dlvsym. Both are interposed here, so
 * neither can be asked for the other: they are read from the C library's
 * symbol table (its GNU hash), reached through the loader's list of
 * objects (_r_debug): no function is called, so this works in the first
 * lookup of all, a sanitizer's runtime's while it sets itself up (its
 * interceptors, dl_iterate_phdr's among them, are not ready then). */
SHIM_NO_SANITIZE static uint32_t gnu_hash(const char *s)
{
    uint32_t h = 5381;
    for (; *s; s++)
        h = h * 33 + (unsigned char)*s;
    return h;
}

/* strcmp and strstr are intercepted by sanitizers, and not ready then. */
SHIM_NO_SANITIZE static bool same_string(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

SHIM_NO_SANITIZE static bool names_libc(const char *path)
{
    for (const char *p = path; *p; p++)
        if (p[0] == '/' && p[1] == 'l' && p[2] == 'i' && p[3] == 'b' && p[4] == 'c' &&
            p[5] == '.' && p[6] == 's' && p[7] == 'o')
            return true;
    return false;
}

/* `name` defined by the object `m`, or NULL. */
SHIM_NO_SANITIZE static void *defined_by(const struct link_map *m, const char *name)
{
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *hash = NULL;
    for (const ElfW(Dyn) *dyn = m->l_ld; dyn && dyn->d_tag != DT_NULL; dyn++) {
        /* The loader relocates these in place; an unrelocated one is an
         * offset from the load address. */
        uintptr_t p = dyn->d_un.d_ptr;
        if (p < m->l_addr)
            p += m->l_addr;
        if (dyn->d_tag == DT_SYMTAB)
            symtab = (const ElfW(Sym) *)p;
        else if (dyn->d_tag == DT_STRTAB)
            strtab = (const char *)p;
        else if (dyn->d_tag == DT_GNU_HASH)
            hash = (const uint32_t *)p;
    }
    if (!symtab || !strtab || !hash || hash[0] == 0)
        return NULL;
    uint32_t nbuckets = hash[0], symoffset = hash[1], bloom_size = hash[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)(hash + 4) + bloom_size);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t h = gnu_hash(name);
    uint32_t k = buckets[h % nbuckets];
    if (k < symoffset)
        return NULL;
    for (;; k++) {
        uint32_t ch = chain[k - symoffset];
        const ElfW(Sym) *sym = &symtab[k];
        if ((ch | 1) == (h | 1) && sym->st_shndx != SHN_UNDEF && sym->st_value != 0 &&
            same_string(strtab + sym->st_name, name))
            return (void *)(m->l_addr + sym->st_value);
        if (ch & 1)
            return NULL;
    }
}

/* The shim's own ELF header: its load address, to skip itself. */
extern const char __ehdr_start[] __attribute__((visibility("hidden")));

SHIM_NO_SANITIZE static void *libc_function(const char *name)
{
    void *any = NULL;
    for (const struct link_map *m = _r_debug.r_map; m; m = m->l_next) {
        if (m->l_addr == (uintptr_t)__ehdr_start)
            continue;
        void *p = defined_by(m, name);
        if (p && m->l_name && names_libc(m->l_name))
            return p;
        if (p && !any)
            any = p; /* a C library under another name */
    }
    if (!any)
        abort(); /* no C library dlsym: nothing can work (nothing to log with yet) */
    return any;
}

SHIM_NO_SANITIZE static void *(*resolve_next(void))(void *, const char *)
{
    void *(*fn)(void *, const char *) = atomic_load_explicit(&shim_dlsym_next, memory_order_acquire);
    if (fn)
        return fn;
    *(void **)&fn = libc_function("dlsym");
    atomic_store_explicit(&shim_dlsym_next, fn, memory_order_release);
    return fn;
}

SHIM_NO_SANITIZE static void *(*resolve_vnext(void))(void *, const char *, const char *)
{
    void *(*fn)(void *, const char *, const char *) =
        atomic_load_explicit(&shim_dlvsym_next, memory_order_acquire);
    if (fn)
        return fn;
    *(void **)&fn = libc_function("dlvsym");
    atomic_store_explicit(&shim_dlvsym_next, fn, memory_order_release);
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

bool shim_object_defines(const void *addr, const char *name)
{
    Dl_info info;
    struct link_map *m = NULL;
    shim_loader_check("dladdr1");
    shim_fork_gate_enter();
    int found = dladdr1(addr, &info, (void **)&m, RTLD_DL_LINKMAP);
    shim_fork_gate_leave();
    return found && m && defined_by(m, name) != NULL;
}

/* The registered lookups, one per runtime file that serves names by
 * dlsym (CUDA's driver, OpenCL); registered at load time, in constructor
 * order, each asked in turn. */
#define MAX_LOOKUPS 4
static _Atomic(shim_dlsym_lookup_fn) lookups[MAX_LOOKUPS];

void shim_dlsym_set_lookup(shim_dlsym_lookup_fn fn)
{
    for (size_t i = 0; i < MAX_LOOKUPS; i++) {
        shim_dlsym_lookup_fn none = NULL;
        if (atomic_compare_exchange_strong(&lookups[i], &none, fn) || none == fn)
            return;
    }
}

/* A lookup of a name that may be one the shim serves. */
static void *pick_served(void *handle, const char *name, void *ret)
{
    if (shim_is_own_address(ret))
        return NULL; /* the shim looking for the real function */
    for (size_t i = 0; i < MAX_LOOKUPS; i++) {
        shim_dlsym_lookup_fn fn = atomic_load_explicit(&lookups[i], memory_order_acquire);
        if (!fn)
            break;
        void *p = fn(handle, name, ret);
        if (p)
            return p;
    }
    return NULL;
}

/* The fast test on a name: only the runtimes' prefixes ("cu" for CUDA,
 * "cl" for OpenCL) may be served. */
static inline bool maybe_served(const char *name)
{
    return name[0] == 'c' && (name[1] == 'u' || name[1] == 'l');
}

/* From the dlvsym stub, with its arguments and its caller's return
 * address: as dlsym, for a name the C library finds at that version (a
 * driver whose functions are versioned; the real driver's are not, and
 * its dlvsym answers nothing). NULL: the stub forwards the call. */
SHIM_NO_SANITIZE __attribute__((visibility("hidden"))) void *shim_dlvsym_pick(void *handle,
                                                                         const char *name,
                                                                         const char *version,
                                                                         void *ret)
{
    void *(*vnext)(void *, const char *, const char *) = resolve_vnext();
    resolve_next();
    if (!name || handle == RTLD_NEXT || handle == RTLD_DEFAULT || !maybe_served(name))
        return NULL;
    shim_loader_check("dlvsym");
    shim_fork_gate_enter();
    void *real = vnext(handle, name, version);
    shim_fork_gate_leave();
    if (!real)
        return NULL; /* the stub asks again: the C library's own error */
    return pick_served(handle, name, ret);
}

/* From the stub, with dlsym's arguments and its caller's return address.
 * NULL: the stub forwards the call untouched. */
SHIM_NO_SANITIZE __attribute__((visibility("hidden"))) void *shim_dlsym_pick(void *handle,
                                                                        const char *name,
                                                                        void *ret)
{
    resolve_next();
    /* The special handles are relative to the caller or global: the global
     * scope already finds the shim's exports first, and RTLD_NEXT must stay
     * the caller's. The fast test on the name keeps everything else cheap
     * (and out of instrumented code). */
    if (!name || handle == RTLD_NEXT || handle == RTLD_DEFAULT || !maybe_served(name))
        return NULL;
    return pick_served(handle, name, ret);
}
