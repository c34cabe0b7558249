/* The slice of the Python C API the collector uses, resolved by name from
 * the interpreter find.c located, with hand-written prototypes (no Python
 * headers at build time). One table for CPython 3.8+ (newer names first,
 * then older) and PyPy (PyPy-prefixed names). */
#ifndef SHIM_PYAPI_H
#define SHIM_PYAPI_H

#include <stdbool.h>
#include "find.h"

typedef struct shim_pyobj shim_pyobj;     /* PyObject, never dereferenced */
typedef struct shim_pytstate shim_pytstate;
typedef struct shim_pyinterp shim_pyinterp;

/* PyMethodDef's layout, stable since Python 3.0. */
typedef struct shim_pymethoddef {
    const char *ml_name;
    shim_pyobj *(*ml_meth)(shim_pyobj *self, shim_pyobj *unused);
    int ml_flags;
    const char *ml_doc;
} shim_pymethoddef;
#define SHIM_METH_VARARGS 0x0001
#define SHIM_METH_NOARGS 0x0004

/* X(field, return type, parameters, CPython name, older CPython name or NULL,
 *   PyPy name or NULL, required on CPython, required on PyPy) */
#define SHIM_PYAPI_FUNCTIONS(X) \
    X(is_initialized, int, (void), "Py_IsInitialized", NULL, "PyPy_IsInitialized", 1, 1) \
    X(is_finalizing, int, (void), "Py_IsFinalizing", "_Py_IsFinalizing", "_PyPy_IsFinalizing", 1, 0) \
    X(tstate_unchecked, shim_pytstate *, (void), "PyThreadState_GetUnchecked", \
      "_PyThreadState_UncheckedGet", NULL, 1, 0) \
    X(gilstate_this, shim_pytstate *, (void), "PyGILState_GetThisThreadState", NULL, NULL, 1, 0) \
    X(gilstate_check, int, (void), "PyGILState_Check", NULL, "PyPyGILState_Check", 0, 1) \
    X(gil_ensure, int, (void), "PyGILState_Ensure", NULL, "PyPyGILState_Ensure", 1, 1) \
    X(gil_release, void, (int), "PyGILState_Release", NULL, "PyPyGILState_Release", 1, 1) \
    X(save_thread, shim_pytstate *, (void), "PyEval_SaveThread", NULL, "PyPyEval_SaveThread", 1, 1) \
    X(restore_thread, void, (shim_pytstate *), "PyEval_RestoreThread", NULL, \
      "PyPyEval_RestoreThread", 1, 1) \
    X(tstate_interp, shim_pyinterp *, (shim_pytstate *), "PyThreadState_GetInterpreter", NULL, \
      NULL, 0, 0) \
    X(interp_main, shim_pyinterp *, (void), "PyInterpreterState_Main", NULL, NULL, 1, 0) \
    X(import_module, shim_pyobj *, (const char *), "PyImport_ImportModule", NULL, \
      "PyPyImport_ImportModule", 1, 1) \
    X(getattr, shim_pyobj *, (shim_pyobj *, const char *), "PyObject_GetAttrString", NULL, \
      "PyPyObject_GetAttrString", 1, 1) \
    X(call_object, shim_pyobj *, (shim_pyobj *, shim_pyobj *), "PyObject_CallObject", NULL, \
      "PyPyObject_CallObject", 1, 1) \
    X(call_objargs, shim_pyobj *, (shim_pyobj *, ...), "PyObject_CallFunctionObjArgs", NULL, \
      "PyPyObject_CallFunctionObjArgs", 1, 0) \
    X(incref, void, (shim_pyobj *), "Py_IncRef", NULL, "PyPy_IncRef", 1, 1) \
    X(decref, void, (shim_pyobj *), "Py_DecRef", NULL, "PyPy_DecRef", 1, 1) \
    X(err_fetch, void, (shim_pyobj **, shim_pyobj **, shim_pyobj **), "PyErr_Fetch", NULL, \
      "PyPyErr_Fetch", 1, 1) \
    X(err_restore, void, (shim_pyobj *, shim_pyobj *, shim_pyobj *), "PyErr_Restore", NULL, \
      "PyPyErr_Restore", 1, 1) \
    X(err_clear, void, (void), "PyErr_Clear", NULL, "PyPyErr_Clear", 1, 1) \
    X(tuple_get, shim_pyobj *, (shim_pyobj *, long), "PyTuple_GetItem", NULL, NULL, 1, 0) \
    X(str_cmp_ascii, int, (shim_pyobj *, const char *), "PyUnicode_CompareWithASCIIString", \
      NULL, NULL, 1, 0) \
    X(list_append, int, (shim_pyobj *, shim_pyobj *), "PyList_Append", NULL, NULL, 1, 0) \
    X(long_as_long, long, (shim_pyobj *), "PyLong_AsLong", NULL, "PyPyLong_AsLong", 1, 1) \
    X(cfunction_new, shim_pyobj *, (shim_pymethoddef *, shim_pyobj *, shim_pyobj *), \
      "PyCFunction_NewEx", NULL, NULL, 1, 0) \
    X(add_pending_call, int, (int (*)(void *), void *), "Py_AddPendingCall", NULL, NULL, 0, 0) \
    X(code_addr2line, int, (shim_pyobj *, int), "PyCode_Addr2Line", NULL, NULL, 0, 0) \
    X(unicode_as_utf8, const char *, (shim_pyobj *), "PyUnicode_AsUTF8", NULL, NULL, 0, 0) \
    X(unicode_encode_fs, shim_pyobj *, (shim_pyobj *), "PyUnicode_EncodeFSDefault", NULL, NULL, \
      0, 0) \
    X(bytes_as_string, char *, (shim_pyobj *), "PyBytes_AsString", NULL, NULL, 0, 0) \
    X(at_exit, int, (void (*)(void)), "Py_AtExit", NULL, "PyPy_AtExit", 1, 1) \
    X(run_simple_string, int, (const char *), "PyRun_SimpleString", NULL, "PyPyRun_SimpleString", \
      0, 1) \
    X(init_threads, void, (void), "PyEval_InitThreads", NULL, "PyPyEval_InitThreads", 0, 1)

typedef struct shim_pyapi {
    const shim_python *py;
    bool pypy;
    bool tls_tstate;   /* 3.12+: the current thread state is thread-local */
    shim_pyobj *none;  /* Py_None */
#define SHIM_PYAPI_FIELD(f, ret, params, n1, n2, np, rc, rp) ret(*f) params;
    SHIM_PYAPI_FUNCTIONS(SHIM_PYAPI_FIELD)
#undef SHIM_PYAPI_FIELD
} shim_pyapi;

/* Rows marked optional on CPython that a user needs (Python stacks need
 * PyCode_Addr2Line and PyUnicode_AsUTF8, present in every CPython 3.8+) are
 * checked by that user: their absence must not turn garbage collection off. */

/* The table for the interpreter in the process, or NULL when there is none
 * (or it lacks a required function: logged once). Looks for the interpreter
 * again when objects were loaded since; may call into the dynamic loader, so
 * never call it with the allocator lock held. */
const shim_pyapi *shim_pyapi_get(void);
/* The table resolved last, without looking again (any context). */
const shim_pyapi *shim_pyapi_cached(void);
void shim_pyapi_atfork_child(void);

/* How the calling thread stands with respect to the interpreter. Needs no
 * GIL, takes no lock, on CPython. On PyPy only PyGILState_Check is safe
 * without the GIL (everything else waits for it). */
enum shim_py_attach {
    SHIM_PY_DETACHED,       /* holds no GIL: must not wait for it unbounded */
    SHIM_PY_ATTACHED_MAIN,  /* attached to the main interpreter */
    SHIM_PY_ATTACHED_SUB,   /* attached to a subinterpreter (3.12+) */
    SHIM_PY_SUB_UNKNOWN,    /* 3.11-: a subinterpreter's thread holds the GIL,
                               possibly this one: neither collect nor wait */
};
enum shim_py_attach shim_py_attachment(const shim_pyapi *api);

/* The one rule for "which thread state is this thread's, and is this
 * thread attached to it" on CPython (not PyPy), without the GIL and without
 * a lock: cheap enough for every allocation (Python stacks call it on each
 * capture), hence inline. Returns the thread state whose frames are this
 * thread's (NULL: the thread never ran Python); *attached tells whether the
 * thread holds the GIL with it; *current (may be NULL) receives the current
 * thread state.
 *
 * From 3.12 the current thread state is thread-local, set exactly while
 * attached (PyGILState_Check would be wrong once any subinterpreter exists
 * and after finalization). Before, it is process-wide: the GIL holder's,
 * this thread's only when it equals this thread's PyGILState one. A thread
 * that released the GIL keeps its thread state in PyGILState's
 * thread-local slot, with its frame chain intact. */
static inline shim_pytstate *shim_py_own_tstate(const shim_pyapi *api, bool *attached,
                                                shim_pytstate **current)
{
    shim_pytstate *cur = api->tstate_unchecked();
    if (current)
        *current = cur;
    if (api->tls_tstate) {
        *attached = cur != NULL;
        return cur ? cur : api->gilstate_this();
    }
    shim_pytstate *own = api->gilstate_this();
    *attached = own != NULL && cur == own;
    return own;
}

/* gc.collect() with the GIL held: the number it returned (-1: it raised;
 * the exception is cleared). Calls gc.collect rather than PyGC_Collect:
 * the latter silently does nothing once a program called gc.disable(). */
long shim_py_gc_collect(const shim_pyapi *api);

#endif
