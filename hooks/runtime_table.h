/* A runtime's table of real functions (runtime_table.c), shared by the
 * runtime files that reach a library the program loads itself (the CUDA
 * driver, OpenCL): learnt once from where the functions are (a handle of
 * the library, or the process's scopes), published with one
 * compare-and-swap (no lock: learning calls the loader, whose lock a
 * library constructor that allocates may hold while it waits for us),
 * and a warning said once when the library is nowhere to be found.
 *
 * A runtime file keeps its functions in a struct of function pointers
 * only, listed by an X-macro, and describes it with SHIM_RT_TABLE: its
 * names in field order, and which fields it cannot do without. */
#ifndef SHIM_HOOKS_RUNTIME_TABLE_H
#define SHIM_HOOKS_RUNTIME_TABLE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct shim_rt_table {
    const char *const *names; /* the symbols, one per field, in order */
    size_t count;
    /* Whether a table has what the file needs (NULL: anything found). */
    bool (*complete)(const void *table);
    const char *missing; /* the warning when the process has none */
    _Atomic(void *) published;
    _Atomic bool warned;
} shim_rt_table;

/* The table in use, made from `handle`'s object when there is none yet
 * (the shim's own definitions skipped); NULL while it is incomplete
 * there. */
void *shim_rt_table_from_handle(shim_rt_table *t, void *handle);
/* The same from the process's scopes, without loading anything; warns
 * once while there is none. */
void *shim_rt_table_from_scopes(shim_rt_table *t);
/* Every entry point's first step: the published table, else the
 * scopes'. Inline: after the first call, one acquire load. */
static inline void *shim_rt_table_get(shim_rt_table *t)
{
    void *p = atomic_load_explicit(&t->published, memory_order_acquire);
    return p ? p : shim_rt_table_from_scopes(t);
}
/* The published table or NULL, for the shim's callbacks (never learns). */
static inline void *shim_rt_table_peek(shim_rt_table *t)
{
    return atomic_load_explicit(&t->published, memory_order_acquire);
}
/* dlsym(handle, name) of the program where the shim has `ours` for
 * `name`: `ours` when `handle`'s object defines the name for real (the
 * runtime's library) and the table could be learnt from it, else NULL
 * (the C library answers). dlerror() is left as the caller's own lookup
 * of `name` would leave it. */
void *shim_rt_table_lookup(shim_rt_table *t, void *handle, const char *name, void *ours);

/* A runtime file's description: TYPE its struct, LIST its X-macro whose
 * second argument is the symbol; `storage` static, or empty for a table
 * several files of one runtime share. */
#define SHIM_RT_TABLE_NAME_(f, sym, ...) #sym,
#define SHIM_RT_TABLE(storage, var, TYPE, LIST, complete_fn, missing_text)               \
    static const char *const var##_names[] = {LIST(SHIM_RT_TABLE_NAME_)};                \
    _Static_assert(sizeof(TYPE) == sizeof var##_names / sizeof var##_names[0] *         \
                                       sizeof(void (*)(void)),                           \
                   "a runtime table holds function pointers only");                     \
    storage shim_rt_table var = {.names = var##_names,                                    \
                                .count = sizeof var##_names / sizeof var##_names[0],     \
                                .complete = complete_fn,                                 \
                                .missing = missing_text}

#endif
