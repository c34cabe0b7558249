/* Runtime tables (runtime_table.h): the real functions of a library the
 * program loads, learnt once and published with one compare-and-swap.
 * Owns nothing but the tables it publishes (never freed: a published
 * table is read without a lock for the process's life). No lock; calls
 * the loader (dlsym) outside any lock of ours. */
#include "runtime_table.h"

#include <stdlib.h>

#include "hooks.h"
#include "log.h"

typedef void *(*finder)(void *where, const char *name);

static void *find_in_handle(void *handle, const char *name)
{
    void *p = shim_real_dlsym(handle, name);
    return shim_is_own_address(p) ? NULL : p;
}

static void *find_in_scopes(void *unused, const char *name)
{
    (void)unused;
    return shim_resolve_real(name);
}

/* Function pointers are stored as the struct's fields: a struct of
 * function pointers is laid out as an array of them (SHIM_RT_TABLE
 * checks the size). */
typedef void (*any_fn)(void);

static void *learn(shim_rt_table *t, finder find, void *where)
{
    void *cur = atomic_load_explicit(&t->published, memory_order_acquire);
    if (cur)
        return cur;
    any_fn *fns = calloc(t->count, sizeof *fns);
    if (!fns)
        return NULL;
    for (size_t i = 0; i < t->count; i++)
        *(void **)&fns[i] = find(where, t->names[i]);
    if (t->complete && !t->complete(fns)) {
        free(fns);
        return NULL;
    }
    void *expected = NULL;
    if (atomic_compare_exchange_strong(&t->published, &expected, (void *)fns))
        return fns;
    free(fns); /* another thread was first */
    return expected;
}

void *shim_rt_table_from_handle(shim_rt_table *t, void *handle)
{
    return learn(t, find_in_handle, handle);
}

__attribute__((noinline)) void *shim_rt_table_from_scopes(shim_rt_table *t)
{
    void *p = learn(t, find_in_scopes, NULL);
    if (!p && !atomic_exchange(&t->warned, true))
        shim_warn("%s", t->missing);
    return p;
}

void *shim_rt_table_lookup(shim_rt_table *t, void *handle, const char *name, void *ours)
{
    void *real = shim_real_dlsym(handle, name);
    if (!real || shim_is_own_address(real))
        return NULL;
    void *table = shim_rt_table_from_handle(t, handle);
    /* Learning probes names the library may lack, each leaving an error
     * for dlerror(); a successful lookup clears it, as the caller's own
     * lookup of this name would have. */
    shim_real_dlsym(handle, name);
    return table ? ours : NULL;
}
