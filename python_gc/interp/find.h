/* Locating the Python interpreter the process already embeds, on demand,
 * without ever loading one: CPython 3.8+ (static, shared or dlopen'ed
 * RTLD_LOCAL by an embedder, free-threaded builds too) and PyPy. */
#ifndef SHIM_FIND_H
#define SHIM_FIND_H

#include <stdbool.h>

enum shim_py_kind { SHIM_PY_NONE = 0, SHIM_PY_CPYTHON, SHIM_PY_PYPY };

typedef struct shim_python {
    enum shim_py_kind kind;
    int major, minor, micro;
    bool free_threaded;
    bool debug_build;
    const char *path;          /* the object exporting the C API */
    void *handle;              /* dlopen(path, RTLD_NOLOAD) handle */
} shim_python;

/* The embedded interpreter, or NULL when there is none. Once found, it is
 * returned without any loader call. Without one: shim_python_find_now
 * reads the loader's counters (one dl_iterate_phdr call stopped at its
 * first object) and scans again only when objects were loaded since the
 * last scan; shim_python_find (the allocation path) reads them only once a
 * hint came since the last read, or when no hint ever comes. Both return
 * the last result without looking when the caller holds a shim lock.
 * Thread-safe; never called with the allocator lock held. */
const shim_python *shim_python_find(void);
const shim_python *shim_python_find_now(void);
/* New code may be running (leak checking: a native stack never seen
 * before): the next shim_python_find reads the loader's counters. Takes no
 * lock, calls nothing. */
void shim_python_find_hint(void);
/* Looks `name` up in the interpreter's object ("PyGC_Collect"; on PyPy the
 * caller passes the PyPy-prefixed name). NULL when absent. */
void *shim_python_sym(const shim_python *py, const char *name);
/* fork(): the child re-initializes the lock (its holder did not fork). */
void shim_python_find_atfork_child(void);

#endif
