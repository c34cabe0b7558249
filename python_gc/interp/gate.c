/* The lifecycle gate: when collecting is allowed.
 *
 * Nothing may run Python before Py_IsInitialized() or once finalization has
 * begun, and PyGILState_Ensure during finalization kills (3.8 to 3.13.0),
 * hangs (3.13.8+) or lets Python run in the middle of teardown (3.14). A
 * Python atexit callback, registered without headers, runs on every version
 * before finalization starts: it closes the gate and waits (GIL released)
 * for the collections in flight. A C-level Py_AtExit function, run at the
 * very end of finalization, marks the gate unarmed so that the next
 * Py_Initialize cycle registers the callback again. PyPy (which never
 * re-initializes) closes the gate through PyPy_AtExit.
 *
 * States: UNARMED (no callback registered in this cycle) -> OPEN (callback
 * registered) -> CLOSED (callback ran) -> UNARMED (finalization finished).
 *
 * Owns the state, the in-flight count and the close-time functions; all
 * guarded by gate_mu, a leaf lock never held while calling Python or while
 * taking any other lock.
 * Locks, their order and fork: docs/locking.md. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "clock.h"
#include "gate.h"
#include "log.h"
#include "mutex.h"

enum { UNARMED, OPEN, CLOSED };

#define MAX_ON_CLOSE 8

static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv;
static pthread_once_t gate_once = PTHREAD_ONCE_INIT;
static int state = UNARMED;
static unsigned inflight;
static unsigned long cycles;
static unsigned long scheduled_cycle = (unsigned long)-1;
static unsigned wait_ms = 30000;
static void (*on_close[MAX_ON_CLOSE])(void);
static int n_on_close;
/* The table of the interpreter the gate was armed for (callbacks get no
 * context argument from Py_AtExit). */
static const shim_pyapi *armed_api;

static void gate_init_once(void)
{
    shim_cond_init_monotonic(&gate_cv);
}

static void gate_lock(void)
{
    pthread_once(&gate_once, gate_init_once);
    shim_mutex_lock(&gate_mu);
}

enum shim_gate_verdict shim_gate_enter(const shim_pyapi *api)
{
    (void)api;
    gate_lock();
    enum shim_gate_verdict v = state == OPEN ? SHIM_GATE_ADMIT
                               : state == UNARMED ? SHIM_GATE_ADMIT_UNARMED
                                                  : SHIM_GATE_REFUSE;
    if (v != SHIM_GATE_REFUSE)
        inflight++;
    shim_mutex_unlock(&gate_mu);
    return v;
}

void shim_gate_leave(void)
{
    gate_lock();
    if (inflight > 0 && --inflight == 0)
        pthread_cond_broadcast(&gate_cv);
    shim_mutex_unlock(&gate_mu);
}

bool shim_gate_is_open(void)
{
    gate_lock();
    bool open = state == OPEN;
    shim_mutex_unlock(&gate_mu);
    return open;
}

void shim_gate_on_close(void (*fn)(void))
{
    gate_lock();
    bool dup = false;
    for (int i = 0; i < n_on_close; i++)
        dup |= on_close[i] == fn;
    if (!dup && n_on_close < MAX_ON_CLOSE)
        on_close[n_on_close++] = fn;
    shim_mutex_unlock(&gate_mu);
}

void shim_gate_set_wait_ms(unsigned ms)
{
    gate_lock();
    wait_ms = ms;
    shim_mutex_unlock(&gate_mu);
}

unsigned long shim_gate_cycles(void)
{
    gate_lock();
    unsigned long c = cycles;
    shim_mutex_unlock(&gate_mu);
    return c;
}

/* Runs the close-time functions (GIL held), closes the gate and waits for
 * the collections in flight; `api` may release the GIL meanwhile. */
static void close_and_drain(const shim_pyapi *api, bool release_gil)
{
    void (*fns[MAX_ON_CLOSE])(void);
    gate_lock();
    int n = n_on_close;
    for (int i = 0; i < n; i++)
        fns[i] = on_close[i];
    shim_mutex_unlock(&gate_mu);
    for (int i = 0; i < n; i++)
        fns[i]();

    gate_lock();
    state = CLOSED;
    bool busy = inflight > 0;
    shim_mutex_unlock(&gate_mu);
    if (!busy)
        return;

    /* A collection in flight may be waiting for the GIL we hold. */
    shim_pytstate *ts = release_gil ? api->save_thread() : NULL;
    struct timespec deadline;
    shim_deadline_after_ms(&deadline, wait_ms);
    gate_lock();
    int rc = 0;
    while (inflight > 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&gate_cv, &gate_mu, &deadline);
    unsigned left = inflight;
    shim_mutex_unlock(&gate_mu);
    if (left)
        shim_warn("python_gc: %u collection(s) still running as Python finalizes "
                  "(waited %u ms)", left, wait_ms);
    if (ts)
        api->restore_thread(ts);
}

/* The Python atexit callback: runs on the finalizing thread with the GIL,
 * before Py_FinalizeEx marks the runtime as finalizing. */
static shim_pyobj *gate_atexit(shim_pyobj *self, shim_pyobj *unused)
{
    (void)self;
    (void)unused;
    const shim_pyapi *api = armed_api;
    close_and_drain(api, true);
    api->incref(api->none);
    return api->none;
}

/* Py_AtExit: the end of Py_FinalizeEx, Python gone. */
static void gate_ll_exit(void)
{
    gate_lock();
    state = UNARMED;
    cycles++;
    shim_mutex_unlock(&gate_mu);
}

/* PyPy_AtExit: cpyext's shutdown, the GIL held by the exiting thread in a
 * way a C function cannot portably release: wait without releasing it (a
 * collection in flight on the shim's thread then finishes after the wait). */
static void gate_pypy_exit(void)
{
    const shim_pyapi *api = armed_api;
    gate_lock();
    unsigned saved = wait_ms;
    wait_ms = 100;
    shim_mutex_unlock(&gate_mu);
    close_and_drain(api, false);
    gate_lock();
    wait_ms = saved;
    shim_mutex_unlock(&gate_mu);
}

/* gc.callbacks hook: ("start"|"stop", info). Python calls it with the GIL
 * around every collection of the interpreter, its own and ours. */
static _Atomic int collector_depth;
static _Atomic unsigned long collector_thread;   /* pthread_self of the collector */

static shim_pyobj *gc_phase(shim_pyobj *self, shim_pyobj *args)
{
    (void)self;
    const shim_pyapi *api = armed_api;
    shim_pyobj *phase = api->tuple_get(args, 0);
    if (!phase) {
        api->err_clear();
    } else if (api->str_cmp_ascii(phase, "start") == 0) {
        atomic_store(&collector_thread, (unsigned long)pthread_self());
        atomic_fetch_add(&collector_depth, 1);
    } else if (atomic_load(&collector_depth) > 0) {
        if (atomic_fetch_sub(&collector_depth, 1) == 1)
            atomic_store(&collector_thread, 0);
    }
    api->incref(api->none);
    return api->none;
}

int shim_gate_collector_running(void)
{
    if (atomic_load(&collector_depth) <= 0)
        return 0;
    return atomic_load(&collector_thread) == (unsigned long)pthread_self() ? 1 : 2;
}

static shim_pymethoddef gc_phase_def = {
    "_spyreshim_gc_phase", gc_phase, SHIM_METH_VARARGS,
    "spyreshim: notes when the collector runs",
};

static shim_pymethoddef gate_def = {
    "_spyreshim_gc_gate", gate_atexit, SHIM_METH_NOARGS,
    "spyreshim: stop collecting garbage for the device allocator before finalization",
};

static int register_cpython(const shim_pyapi *api)
{
    int rc = -1;
    shim_pyobj *fn = NULL, *mod = NULL, *reg = NULL, *res = NULL;
    fn = api->cfunction_new(&gate_def, NULL, NULL);
    if (fn)
        mod = api->import_module("atexit");
    if (mod)
        reg = api->getattr(mod, "register");
    if (reg)
        res = api->call_objargs(reg, fn, (shim_pyobj *)NULL);
    if (res) {
        rc = 0;
        api->decref(res);
    }
    if (reg)
        api->decref(reg);
    if (mod)
        api->decref(mod);
    if (fn)
        api->decref(fn);
    if (rc == 0) {
        /* The phase hook is an optimisation: failing to add it is not an
         * error of the gate's. */
        shim_pyobj *gcm = api->import_module("gc");
        shim_pyobj *cbs = gcm ? api->getattr(gcm, "callbacks") : NULL;
        shim_pyobj *hook = cbs ? api->cfunction_new(&gc_phase_def, NULL, NULL) : NULL;
        if (hook)
            api->list_append(cbs, hook);
        if (hook)
            api->decref(hook);
        if (cbs)
            api->decref(cbs);
        if (gcm)
            api->decref(gcm);
        atomic_store(&collector_depth, 0);
    }
    api->err_clear();
    /* Fails only when its 32 slots are full: the gate then notices the end
     * of finalization by seeing Py_IsInitialized() == 0 (shim_gate_enter's
     * callers check it first). */
    if (api->at_exit(gate_ll_exit) != 0)
        shim_debug("python_gc: Py_AtExit table full");
    return rc;
}

int shim_gate_arm(const shim_pyapi *api)
{
    gate_lock();
    if (state != UNARMED) {
        int rc = state == OPEN ? 0 : -1;
        shim_mutex_unlock(&gate_mu);
        return rc;
    }
    armed_api = api;
    shim_mutex_unlock(&gate_mu);

    shim_pyobj *t, *v, *tb;
    api->err_fetch(&t, &v, &tb);
    int rc;
    if (api->pypy) {
        rc = api->at_exit(gate_pypy_exit) == 0 ? 0 : -1;
        if (rc != 0)
            api->err_clear();
    } else {
        rc = register_cpython(api);
    }
    api->err_restore(t, v, tb);

    gate_lock();
    if (rc == 0 && state == UNARMED)
        state = OPEN;
    shim_mutex_unlock(&gate_mu);
    if (rc != 0)
        shim_warn("python_gc: could not register the interpreter exit hook; "
                  "collections stay off while Python finalizes");
    else
        shim_debug("python_gc: exit gate armed (cycle %lu)", cycles);
    return rc;
}

static int pending_arm(void *arg)
{
    (void)arg;
    const shim_pyapi *api = shim_pyapi_cached();
    if (api && !api->pypy && api->is_initialized() && !api->is_finalizing() &&
        shim_py_attachment(api) == SHIM_PY_ATTACHED_MAIN)
        shim_gate_arm(api);
    return 0;
}

void shim_gate_schedule_arm(const shim_pyapi *api)
{
    if (!api || api->pypy || !api->add_pending_call)
        return;
    gate_lock();
    bool go = state == UNARMED && scheduled_cycle != cycles;
    if (go)
        scheduled_cycle = cycles;
    shim_mutex_unlock(&gate_mu);
    if (go && api->is_initialized() && !api->is_finalizing())
        api->add_pending_call(pending_arm, NULL);
}

void shim_gate_atfork_child(void)
{
    /* Collections in flight in the parent do not exist in the child. */
    pthread_mutex_init(&gate_mu, NULL);
    gate_init_once();
    inflight = 0;
}

void shim_gate_at_finalize(void (*fn)(void))
{
    if (!fn)
        return;
    shim_gate_on_close(fn);
    /* The functions run only when the gate closes, so it must be armed even
     * in a program that never runs short of memory. */
    shim_gate_schedule_arm(shim_pyapi_get());
}
