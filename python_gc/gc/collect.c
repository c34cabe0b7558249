/* Running the interpreter's cyclic collector, GIL held.
 *
 * Owns nothing; takes no lock of the shim's (a free-threaded collection
 * stops the world, and finalizers it runs free device memory through the
 * allocator lock). Calls gc.collect rather than PyGC_Collect: the latter
 * silently does nothing once a program called gc.disable(), which many
 * training scripts do. */
#include <time.h>

#include "clock.h"
#include "collect.h"
#include "pressure.h"

#define PYPY_MIN_ROUNDS 2
#define PYPY_MAX_ROUNDS 4

static long gc_collect(const shim_pyapi *api)
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

void shim_collect_with_gil(const shim_pyapi *api, shim_collect_result *r)
{
    shim_pyobj *t, *v, *tb;
    api->err_fetch(&t, &v, &tb);
    /* Outside the collection's own time: what the leak layer does at the
     * boundaries (docs/report-format.md, "collections") is its cost. */
    shim_pressure_collection_begin();
    uint64_t freed0 = shim_pressure_freed_total();
    uint64_t t0 = shim_now_ns();
    r->objects = gc_collect(api);
    r->rounds = 1;
    if (api->pypy) {
        /* Up to 7.3.13, gc.collect() returns before cpyext runs the
         * tp_dealloc of the PyObjects it found dead; executing any
         * statement runs them. */
        for (;;) {
            uint64_t before = shim_pressure_freed_total();
            api->run_simple_string("pass");
            api->err_clear();
            /* A second round even when this one freed nothing: objects with
             * __del__ are finalized by one collection and freed by the next. */
            bool freeing = shim_pressure_freed_total() != before;
            if (r->rounds >= PYPY_MAX_ROUNDS || (!freeing && r->rounds >= PYPY_MIN_ROUNDS))
                break;
            r->rounds++;
            long more = gc_collect(api);
            if (more > 0)
                r->objects += more;
        }
    }
    r->ns = shim_now_ns() - t0;
    r->freed = shim_pressure_freed_total() - freed0;
    shim_pressure_collection_end(r->ns, r->freed, r->objects);
    api->err_restore(t, v, tb);
}
