/* The start of the interpreter's shutdown, for the exit check.
 *
 * The leak report at exit runs after Python finalized. What a Python object
 * still held when the interpreter began to shut down (a cache that grew, a
 * model in a global) is not a leak: finalization may free it or not (a
 * PyTorch 2.x model's parameters outlive Py_FinalizeEx, 1.13's do not), so
 * "live after finalization" alone judges PyTorch rather than the program.
 * At the gate's close (python_gc/interp/gate.c: an atexit callback, GIL
 * held, before finalization) one gc.collect() runs, so that cycles are not
 * counted as held, and the live records are copied. leak.c reports that
 * copy as "held until exit" and, as leaked, only what is live at exit and
 * was not in it.
 *
 * Owns the copy, published by atomic exchange (no lock: one writer per
 * interpreter lifetime, one reader at exit). Never holds a shim lock while
 * calling Python. */
#include "shutdown.h"

#include <stdatomic.h>

#include "gate.h"
#include "pyapi.h"

static _Atomic(spyreshim_snapshot *) g_held;
static atomic_bool g_watching;

static void at_shutdown(void)
{
    const shim_pyapi *api = shim_pyapi_cached();
    if (!api)
        return;
    /* A program that disabled the collector still has its cycles freed by
     * this call (gc.collect ignores gc.disable). */
    shim_pyobj *t, *v, *tb;
    api->err_fetch(&t, &v, &tb);
    shim_py_gc_collect(api);
    api->err_restore(t, v, tb);
    spyreshim_snapshot *s = spyreshim_snapshot_take(0);
    spyreshim_snapshot_free(atomic_exchange(&g_held, s));
}

void shim_shutdown_watch(void)
{
    if (!atomic_exchange(&g_watching, true))
        shim_gate_at_finalize(at_shutdown);
}

spyreshim_snapshot *shim_shutdown_take(void)
{
    return atomic_exchange(&g_held, NULL);
}
