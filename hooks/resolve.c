/* Finding a runtime's real entry points without ever loading a runtime.
 *
 * dlsym(RTLD_NEXT) covers a runtime in the global scope (a program linked
 * against it). When a Python extension module is imported, it and the
 * runtime it depends on are opened RTLD_LOCAL: the extension's calls still
 * bind to our preloaded wrappers (the global scope comes first), but
 * RTLD_NEXT cannot see the real ones. Then we walk the loaded objects and
 * ask each, through a RTLD_NOLOAD handle, for the symbol. Nothing is loaded
 * by name: libcudart may be in the loader cache and must not be pulled into
 * a process that did not load it.
 *
 * Lock: the hook resolution lock (shim_device_publish_lock: one for every
 * runtime, in the allocator room so that the fork policy can take it
 * around fork()) only serializes publishing what was resolved; it is never
 * held across a loader call. A library constructor that allocates device
 * memory runs under the loader's lock: had we held it while waiting for the
 * loader, a thread making its first allocation and that constructor would
 * wait for each other forever.
 * So every thread resolves into locals with no lock held (all loader calls
 * go through loader.h, which checks that), and the first to publish wins.
 * Locks, their order and fork: docs/locking.md. */
#include <stdlib.h>
#include <string.h>

#include "hooks.h"
#include "loader.h"
#include "log.h"

struct paths {
    char **v;
    size_t n, cap;
};

static int collect(struct dl_phdr_info *info, size_t size, void *user)
{
    (void)size;
    struct paths *p = user;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0; /* the executable: already covered by RTLD_NEXT */
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        char **v = realloc(p->v, cap * sizeof *v);
        if (!v)
            return 1;
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n] = strdup(info->dlpi_name);
    if (p->v[p->n])
        p->n++;
    return 0;
}

void *shim_resolve_real(const char *name)
{
    void *f = shim_dlsym(RTLD_NEXT, name);
    if (f && !shim_is_own_address(f))
        return f;

    /* Paths first, dlopen after: no loader calls inside dl_iterate_phdr's
     * callback, which runs under the loader's own lock. */
    struct paths p = {0};
    shim_dl_iterate_phdr(collect, &p);
    f = NULL;
    for (size_t i = 0; i < p.n; i++) {
        if (!f) {
            void *h = shim_dlopen_noload(p.v[i], RTLD_LAZY | RTLD_LOCAL);
            if (h) {
                void *cand = shim_dlsym(h, name);
                if (cand && !shim_is_own_address(cand)) {
                    f = cand;
                    shim_debug("resolved %s in %s (local scope)", name, p.v[i]);
                }
                shim_dlclose(h);
            }
        }
        free(p.v[i]);
    }
    free(p.v);
    return f;
}

#ifdef SPYRESHIM_TEST_HOOKS
/* Test builds only: libspyreshim_testhooks.so (tests/meson.build) compiles
 * this room with SPYRESHIM_TEST_HOOKS; libspyreshim.so never has it
 * (tests/integration/test_exports.py checks its exports). For the
 * "fork-publish" scenario of tests/programs/promises.c: when set, called
 * by a thread publishing a runtime with the hook resolution lock held, so
 * that a test can fork while a thread is there. */
__attribute__((visibility("default"))) void (*_Atomic spyreshim_test_publishing)(void);

static void test_publishing(void)
{
    void (*hook)(void) = atomic_load_explicit(&spyreshim_test_publishing, memory_order_relaxed);
    if (hook)
        hook();
}
#else
static inline void test_publishing(void) {}
#endif

shim_device *shim_hook_device_resolve(shim_hook_slots *s)
{
    shim_device *d = atomic_load_explicit(&s->device, memory_order_acquire);
    if (d)
        return d;
    /* Resolve with no lock held (see the top); concurrent first calls may
     * all resolve, and find the same functions. */
    void *f[SHIM_ROLES];
    bool all = true;
    for (int r = 0; r < SHIM_ROLES; r++)
        all &= (f[r] = shim_resolve_real(s->names[r])) != NULL;
    if (!all) {
        static _Atomic bool warned;
        if (!atomic_exchange(&warned, true))
            shim_warn("%s: the runtime's real %s was not found in the process; "
                      "calls fail with 'invalid value'", s->rt.name,
                      f[SHIM_ROLE_MALLOC] ? s->names[SHIM_ROLE_FREE] : s->names[SHIM_ROLE_MALLOC]);
        return NULL;
    }
    /* Publish: the first thread here fills the runtime and creates its
     * device; later ones take what it published. No loader call inside. */
    shim_device_publish_lock();
    d = atomic_load_explicit(&s->device, memory_order_relaxed);
    if (!d) {
        test_publishing();
        s->rt.real_malloc = (int (*)(void **, size_t))f[SHIM_ROLE_MALLOC];
        s->rt.real_free = (int (*)(void *))f[SHIM_ROLE_FREE];
        s->rt.real_mem_info = (int (*)(size_t *, size_t *))f[SHIM_ROLE_MEMINFO];
        d = shim_device_get(&s->rt);
        atomic_store_explicit(&s->device, d, memory_order_release);
    }
    shim_device_publish_unlock();
    shim_device_learn_capacity(d); /* the runtime asked with no lock of ours held */
    return d;
}
