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

/* The embedded interpreter, or NULL when there is none. Scans again only
 * when objects were loaded since the last scan. Thread-safe. */
const shim_python *shim_python_find(void);
/* Looks `name` up in the interpreter's object ("PyGC_Collect"; on PyPy the
 * caller passes the PyPy-prefixed name). NULL when absent. */
void *shim_python_sym(const shim_python *py, const char *name);
/* fork(): the child re-initializes the lock (its holder did not fork). */
void shim_python_find_atfork_child(void);

#endif
