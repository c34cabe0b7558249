/* Resolving the C API table (pyapi.h) for the interpreter find.c located.
 *
 * Owns: the resolved tables, one per interpreter record, append-only and
 * never freed (a published table is immutable, so readers need no lock).
 * Guarded by api_mu, which is never held across a call into the loader:
 * a table is resolved (dlsym, through loader.h) into a local with no lock
 * held, then api_mu is taken only to append and publish it; concurrent
 * first callers may both resolve, the first to publish wins.
 * Never calls a Python function here: resolution is dlsym only.
 * Locks, their order and fork: docs/locking.md. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "log.h"
#include "mutex.h"
#include "pyapi.h"

#define MAX_TABLES 16

static pthread_mutex_t api_mu = PTHREAD_MUTEX_INITIALIZER;
static shim_pyapi tables[MAX_TABLES];
static int ntables;
static _Atomic(const shim_pyapi *) current;
/* The interpreter whose table failed to resolve: not retried, not re-logged. */
static _Atomic(const shim_python *) unusable;

static bool resolve(const shim_python *py, shim_pyapi *t)
{
    memset(t, 0, sizeof *t);
    t->py = py;
    t->pypy = py->kind == SHIM_PY_PYPY;
    t->tls_tstate = !t->pypy && py->minor >= 12;
    const char *missing = NULL;
#define SHIM_PYAPI_RESOLVE(f, ret, params, n1, n2, np, rc, rp)                     \
    do {                                                                           \
        void *p = NULL;                                                            \
        if (t->pypy) {                                                             \
            if (np)                                                                \
                p = shim_python_sym(py, np);                                       \
        } else {                                                                   \
            p = shim_python_sym(py, n1);                                           \
            if (!p && n2)                                                          \
                p = shim_python_sym(py, n2);                                       \
        }                                                                          \
        *(void **)&t->f = p;                                                       \
        if (!p && !missing && (t->pypy ? (rp) : (rc)))                             \
            missing = t->pypy ? (np) : (n1);                                       \
    } while (0);
    SHIM_PYAPI_FUNCTIONS(SHIM_PYAPI_RESOLVE)
#undef SHIM_PYAPI_RESOLVE
    t->none = shim_python_sym(py, t->pypy ? "_PyPy_NoneStruct" : "_Py_NoneStruct");
    if (!t->none && !missing)
        missing = "_Py_NoneStruct";
    if (missing) {
        shim_warn("python_gc: %s lacks %s; Python garbage collection is off", py->path, missing);
        return false;
    }
    return true;
}

const shim_pyapi *shim_pyapi_cached(void)
{
    return atomic_load_explicit(&current, memory_order_acquire);
}

static const shim_pyapi *published_for(const shim_python *py)
{
    for (int i = 0; i < ntables; i++)
        if (tables[i].py == py)
            return &tables[i];
    return NULL;
}

const shim_pyapi *shim_pyapi_get(void)
{
    const shim_python *py = shim_python_find_now();
    const shim_pyapi *cur = shim_pyapi_cached();
    if (!py || py == atomic_load(&unusable))
        return NULL;
    if (cur && cur->py == py)
        return cur;

    shim_mutex_lock(&api_mu);
    const shim_pyapi *found = published_for(py);
    shim_mutex_unlock(&api_mu);
    if (!found) {
        /* Loader calls: no lock held (see the top). */
        shim_pyapi t;
        bool ok = resolve(py, &t);
        shim_mutex_lock(&api_mu);
        found = published_for(py);
        if (!found && ok && ntables < MAX_TABLES) {
            tables[ntables] = t;
            found = &tables[ntables++];
        } else if (!found && !ok) {
            atomic_store(&unusable, py);
        }
        shim_mutex_unlock(&api_mu);
    }
    if (found)
        atomic_store_explicit(&current, found, memory_order_release);
    return found;
}

void shim_pyapi_atfork_child(void)
{
    pthread_mutex_init(&api_mu, NULL);
}

/* 3.8's PyThreadState begins with prev, next, interp: the layout is stable
 * there and 3.9+ has an accessor. `ts` may be another thread's (the GIL
 * holder's), published by Python with atomics ThreadSanitizer cannot see in
 * an uninstrumented libpython: the read is exempt from it, not unordered. */
__attribute__((no_sanitize("thread")))
static shim_pyinterp *interp_of(const shim_pyapi *api, shim_pytstate *ts)
{
    if (api->tstate_interp)
        return api->tstate_interp(ts);
    return ((shim_pyinterp **)ts)[2];
}

enum shim_py_attach shim_py_attachment(const shim_pyapi *api)
{
    if (api->pypy)
        return api->gilstate_check() ? SHIM_PY_ATTACHED_MAIN : SHIM_PY_DETACHED;
    bool attached;
    shim_pytstate *ts;
    shim_pytstate *own = shim_py_own_tstate(api, &attached, &ts);
    /* 3.11 and older: attached means the current thread state is this
     * thread's PyGILState one, which belongs to the main interpreter. */
    if (attached && !api->tls_tstate)
        return SHIM_PY_ATTACHED_MAIN;
    if (attached)
        return interp_of(api, own) == api->interp_main() ? SHIM_PY_ATTACHED_MAIN
                                                         : SHIM_PY_ATTACHED_SUB;
    /* 3.12+: detached. 3.11 and older: nobody holds the GIL, or someone
     * else does: waiting for it is fine (bounded), unless the holder is a
     * subinterpreter's thread, which may be this very thread (the GILState
     * API cannot tell): Ensure from there deadlocks. */
    if (api->tls_tstate || !ts)
        return SHIM_PY_DETACHED;
    return interp_of(api, ts) == api->interp_main() ? SHIM_PY_DETACHED : SHIM_PY_SUB_UNKNOWN;
}

long shim_py_gc_collect(const shim_pyapi *api)
{
    long n = -1;
    shim_pyobj *gc = api->import_module("gc");
    shim_pyobj *fn = gc ? api->getattr(gc, "collect") : NULL;
    shim_pyobj *res = fn ? api->call_object(fn, NULL) : NULL;
    if (res) {
        /* PyPy's gc.collect() returns None. */
        n = res == api->none ? 0 : api->long_as_long(res);
        api->decref(res);
    }
    if (fn)
        api->decref(fn);
    if (gc)
        api->decref(gc);
    /* An exception out of the collector (a finalizer's is reported, not
     * raised; this is an import or a KeyboardInterrupt) is not ours to
     * surface in the middle of someone's allocation. */
    api->err_clear();
    return n;
}
