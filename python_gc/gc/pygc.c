/* The pressure callback that runs Python's garbage collector, and its
 * adaptive back-off and statistics.
 *
 * Entered with the allocator lock held (the contract in spyreshim.h); it
 * releases the lock at once, because everything after may block: looking
 * for the interpreter (the dynamic loader's lock), the GIL, waiting for the
 * GC thread. It re-acquires it before returning. Lock order, always:
 * allocator lock -> (release) -> GIL -> (release) -> allocator lock.
 *
 * Paths: a thread attached to Python collects inline (it holds the GIL
 * already); any other thread hands the collection to the shim's GC thread
 * and waits with a bound on its progress (gcthread.c: SPYRESHIM_GC_TIMEOUT_MS
 * without progress), failing just that one request when the bound passes.
 * Never PyGILState_Ensure on a thread the shim does not own.
 *
 * Where a collection may run is decided per failing call by the policy
 * (policy.c: who called the runtime, and what lock its allocator holds),
 * through the gate this file registers with the pressure event; the gate
 * also keeps one collection per pressure episode: after a collection made
 * for this thread, its next pressure event before any allocation succeeds
 * anywhere fails at once (the framework's own release-and-retry follows).
 *
 * Owns: the counters (atomics), the back-off state (atomics) and the
 * calling thread's decision and episode (thread-locals). No lock. */
#include <inttypes.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "collect.h"
#include "gate.h"
#include "gcthread.h"
#include "log.h"
#include "options.h"
#include "lock.h"
#include "pressure.h"
#include "progress.h"
#include "device.h"
#include "policy.h"
#include "pygc.h"
#include "pyapi.h"

#define SKIP_REASONS(X)                                                            \
    X(not_initialized, "the interpreter is not initialized")                      \
    X(finalizing, "the interpreter is finalizing")                                \
    X(gate_closed, "the exit gate is closed")                                     \
    X(subinterpreter, "a subinterpreter's thread holds the GIL (3.11 and older)") \
    X(subinterpreter_unarmed, "subinterpreter caller before the gate was armed")  \
    X(pypy_threads, "PyPy threads not initialized yet; caller is a foreign thread") \
    X(no_thread, "the GC thread could not be started")                             \
    X(collector_running, "raised inside a collection already running")

enum skip_reason {
#define X(name, doc) SKIP_##name,
    SKIP_REASONS(X)
#undef X
    SKIP_COUNT
};

static const char *const skip_names[SKIP_COUNT] = {
#define X(name, doc) #name,
    SKIP_REASONS(X)
#undef X
};

static struct {
    _Atomic uint64_t events;          /* callback invocations */
    _Atomic uint64_t event_ns;        /* callback wall time, waits included */
    _Atomic uint64_t collections, inline_collections, thread_collections;
    _Atomic uint64_t collect_ns, max_collect_ns;
    _Atomic uint64_t recovered;
    _Atomic uint64_t timeouts;
    _Atomic uint64_t skipped[SKIP_COUNT];
    _Atomic uint64_t backoff_skips;
    _Atomic uint64_t no_python;       /* events in a process without Python */
    _Atomic uint64_t detaches;        /* waits for another event, detached */
    _Atomic uint64_t refused[SHIM_GC_CALLER_COUNT]; /* policy: no collection for this caller */
    _Atomic uint64_t episode_skips;   /* a second pressure event in one episode */
    _Atomic uint64_t way_skips;       /* SHIM_GC_WAY_INLINE on a detached thread */
} st;

/* The decision of the gate for this thread's current request (read by the
 * callback, on the same thread, in the same relief round). */
static __thread enum shim_gc_way tls_way;
/* The episode: open after a collection made for this thread, until an
 * allocation succeeds anywhere (the allocation sequence moved past mark). */
static __thread bool tls_episode_open;
static __thread uint64_t tls_episode_mark;
/* The allocation sequence when the gate let this request collect: taken
 * before the collection, so that an allocation another thread made during
 * it (taking what it freed) ends the episode. */
static __thread uint64_t tls_gate_mark;

/* Back-off: after a collection that freed nothing, pressure events are
 * not collected until something was freed or allocated since, or a window
 * has passed (the garbage may have been made meanwhile without a device
 * call: references dropped after an out-of-memory). The
 * window is the fruitless event's own duration times 2^level (level grows
 * with each consecutive fruitless collection; at most 1 s), so a program
 * that is simply out of memory spends a bounded fraction of its time
 * collecting; the first collection that frees anything resets it. A
 * collection that ran while another was in flight (the GC thread's, after
 * its requester timed out) proves nothing and leaves the state alone, and
 * any device memory freed since the fruitless collection (the program
 * dropped tensors, or its own collection ran) ends the window: things
 * changed, so the next pressure event collects again. */
#define BACKOFF_MAX_LEVEL 10
#define BACKOFF_MAX_NS 1000000000ull
#define BACKOFF_MIN_NS 50000ull
static _Atomic uint64_t backoff_until;
static _Atomic uint64_t backoff_freed_mark;   /* freed_total when it began */
static _Atomic uint64_t backoff_seq_mark;     /* the allocation sequence when it began */
static _Atomic unsigned backoff_level;

static _Atomic bool enabled;
static unsigned timeout_ms;

static void skip(enum skip_reason r)
{
    atomic_fetch_add(&st.skipped[r], 1);
}

static _Atomic(shim_pygc_collection_fn) collection_hook;

void shim_pygc_set_collection_hook(shim_pygc_collection_fn fn)
{
    atomic_store(&collection_hook, fn);
}

static void note_collection(const shim_collect_result *r, bool on_thread)
{
    shim_pygc_collection_fn hook = atomic_load_explicit(&collection_hook, memory_order_relaxed);
    if (hook)
        hook(r->ns, r->freed, r->objects);
    shim_debug("python_gc: %s collection: %ld objects, %" PRIu64 " bytes freed, %d round(s), "
               "%.3f ms", on_thread ? "GC-thread" : "inline", r->objects, r->freed, r->rounds,
               r->ns / 1e6);
    atomic_fetch_add(&st.collections, 1);
    atomic_fetch_add(on_thread ? &st.thread_collections : &st.inline_collections, 1);
    atomic_fetch_add(&st.collect_ns, r->ns);
    atomic_fetch_add(&st.recovered, r->freed);
    uint64_t m = atomic_load(&st.max_collect_ns);
    while (r->ns > m && !atomic_compare_exchange_weak(&st.max_collect_ns, &m, r->ns))
        ;
}

static void thread_observer(const shim_collect_result *r)
{
    note_collection(r, true);
}

static void update_backoff(uint64_t freed, uint64_t event_ns, uint64_t now, uint64_t seq0)
{
    if (freed > 0) {
        atomic_store(&backoff_level, 0);
        atomic_store(&backoff_until, 0);
        return;
    }
    if (shim_gcthread_busy())
        return;
    unsigned level = atomic_load(&backoff_level);
    if (level < BACKOFF_MAX_LEVEL)
        level++;
    atomic_store(&backoff_level, level);
    uint64_t window = (event_ns > BACKOFF_MIN_NS ? event_ns : BACKOFF_MIN_NS) << level;
    if (window > BACKOFF_MAX_NS)
        window = BACKOFF_MAX_NS;
    atomic_store(&backoff_freed_mark, shim_pressure_freed_total());
    atomic_store(&backoff_seq_mark, seq0);
    atomic_store(&backoff_until, now + window);
}

/* GIL held (the caller is attached): collect on this thread. */
static bool collect_inline(const shim_pyapi *api, enum shim_py_attach a, shim_collect_result *r)
{
    if (api->pypy && api->is_finalizing()) {
        skip(SKIP_finalizing);
        return false;
    }
    if (shim_gcthread_busy()) {
        /* The GC thread is still running a collection whose requester
         * timed out: it has the garbage half-processed (on PyPy its
         * deallocations are queued), so a second collection now would find
         * nothing. Let it finish, detached so that it can take the GIL (or
         * stop the world). */
        atomic_fetch_add(&st.detaches, 1);
        shim_pytstate *ts = api->save_thread();
        shim_gcthread_wait_idle(timeout_ms);
        api->restore_thread(ts);
    }
    int running = api->pypy ? 0 : shim_gate_collector_running();
    if (running == 1) {
        /* A finalizer of a collection running on this thread (the
         * program's own, or an automatic one) needs memory: another
         * collection could not free anything before that one finishes.
         * Fail this request; the running collection frees the garbage
         * right after. */
        skip(SKIP_collector_running);
        return false;
    }
    if (running == 2) {
        /* Another thread's collection (dropped the GIL in a finalizer, or
         * stopping the world): let it finish, detached, then retry. */
        atomic_fetch_add(&st.detaches, 1);
        shim_pytstate *ts = api->save_thread();
        shim_progress_wait w;
        shim_progress_wait_begin(&w, timeout_ms);
        while (shim_gate_collector_running() == 2 &&
               (!shim_progress_wait_past(&w) || shim_progress_wait_extend(&w))) {
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL);
        }
        api->restore_thread(ts);
        skip(SKIP_collector_running);
        return false;
    }
    enum shim_gate_verdict v = shim_gate_enter(api);
    if (v == SHIM_GATE_REFUSE) {
        skip(SKIP_gate_closed);
        return false;
    }
    if (v == SHIM_GATE_ADMIT_UNARMED) {
        if (a != SHIM_PY_ATTACHED_MAIN) {
            shim_gate_leave();
            skip(SKIP_subinterpreter_unarmed);
            return false;
        }
        shim_gate_arm(api);
    }
    if (api->pypy)
        shim_pypy_threads_init(api);
    shim_collect_with_gil(api, r);
    shim_gate_leave();
    note_collection(r, false);
    return true;
}

static bool is_main_thread(void)
{
    return (pid_t)syscall(SYS_gettid) == getpid();
}

/* The wait for the GC thread's collection ended without it (gcthread.c
 * said why). What it freed so far (PyPy frees cycles before it runs their
 * finalizers) may serve the request: it retries when that is at least what
 * it asks; otherwise it fails now, without another round of waiting. */
static void gave_up_waiting(uint64_t freed0, size_t want)
{
    atomic_fetch_add(&st.timeouts, 1);
    if (shim_pressure_freed_total() - freed0 < want)
        shim_pressure_give_up();
}

/* Allocator lock NOT held. */
static void run_event(size_t want)
{
    /* Checked (debug builds): every way on from here takes the GIL, or has
     * the GC thread take it while this thread waits; an inline
     * collection's finalizers drop and retake it. */
    shim_lock_assert_none_held("the GIL");
    const shim_pyapi *api = shim_pyapi_get();
    if (!api) {
        atomic_fetch_add(&st.no_python, 1);
        return;
    }
    uint64_t start = shim_now_ns();
    if (start < atomic_load(&backoff_until) &&
        shim_pressure_freed_total() == atomic_load(&backoff_freed_mark) &&
        shim_device_seq_now() == atomic_load(&backoff_seq_mark)) {
        atomic_fetch_add(&st.backoff_skips, 1);
        return;
    }
    if (!api->pypy) {
        if (!api->is_initialized()) {
            skip(SKIP_not_initialized);
            return;
        }
        if (api->is_finalizing()) {
            skip(SKIP_finalizing);
            return;
        }
    }

    uint64_t freed0 = shim_pressure_freed_total();
    shim_collect_result r;
    bool collected = false;
    enum shim_py_attach a = shim_py_attachment(api);
    enum shim_gc_way way = tls_way;
    bool attached = a == SHIM_PY_ATTACHED_MAIN || a == SHIM_PY_ATTACHED_SUB;
    if (way == SHIM_GC_WAY_INLINE && !attached) {
        /* The caller holds a lock that a collection elsewhere would wait
         * for (policy.c): no collection; out-of-memory at once. */
        atomic_fetch_add(&st.way_skips, 1);
        shim_pressure_give_up();
        return;
    }
    if (way == SHIM_GC_WAY_THREAD && attached && (api->pypy || shim_gate_collector_running() == 0)) {
        /* Asked for the GC thread: let it take the GIL (or stop the
         * world) while this thread waits, detached. */
        atomic_fetch_add(&st.detaches, 1);
        shim_pytstate *ts = api->save_thread();
        enum shim_gcthread_status gs = shim_gcthread_collect(api, timeout_ms, &r);
        api->restore_thread(ts);
        if (gs == SHIM_GCT_TIMEOUT) {
            gave_up_waiting(freed0, want);
            return;
        }
        if (gs != SHIM_GCT_COLLECTED) {
            skip(gs == SHIM_GCT_GATE_CLOSED ? SKIP_gate_closed
                 : gs == SHIM_GCT_NO_THREAD ? SKIP_no_thread : SKIP_finalizing);
            return;
        }
        collected = true;
    }
    if (!collected) switch (a) {
    case SHIM_PY_ATTACHED_MAIN:
    case SHIM_PY_ATTACHED_SUB:
        collected = collect_inline(api, a, &r);
        break;
    case SHIM_PY_SUB_UNKNOWN:
        skip(SKIP_subinterpreter);
        return;
    case SHIM_PY_DETACHED:
        if (api->pypy && !shim_pypy_threads_ready() && !is_main_thread()) {
            /* Only the main thread has run Python so far: the GIL may be
             * held, and waiting for an uninitialized one aborts. */
            skip(SKIP_pypy_threads);
            return;
        }
        switch (shim_gcthread_collect(api, timeout_ms, &r)) {
        case SHIM_GCT_COLLECTED:
            collected = true;
            break;
        case SHIM_GCT_TIMEOUT:
            gave_up_waiting(freed0, want);
            shim_debug("python_gc: no collection in time (%u ms stretches); failing this request",
                       timeout_ms);
            return;
        case SHIM_GCT_NOT_RUNNING:
            skip(SKIP_finalizing);
            return;
        case SHIM_GCT_GATE_CLOSED:
            skip(SKIP_gate_closed);
            return;
        case SHIM_GCT_NO_THREAD:
            skip(SKIP_no_thread);
            return;
        }
        break;
    }
    if (collected) {
        uint64_t end = shim_now_ns();
        update_backoff(shim_pressure_freed_total() - freed0, end - start, end, tls_gate_mark);
        /* The episode opens: the framework's next driver calls for this
         * same allocation (after it released its cache) get no second
         * collection; the first allocation that succeeds anywhere (from
         * the start of this collection on) closes it. */
        tls_episode_open = true;
        tls_episode_mark = tls_gate_mark;
    }
}

/* The pressure event's gate (pressure.h): no allocator lock held. */
static bool gate(size_t want)
{
    (void)want;
    uint64_t now = shim_device_seq_now();
    if (tls_episode_open) {
        if (now == tls_episode_mark) {
            atomic_fetch_add(&st.episode_skips, 1);
            return false;
        }
        tls_episode_open = false;
    }
    tls_gate_mark = now;
    const shim_pyapi *api = shim_pyapi_get();
    bool free_threaded = api && !api->pypy && api->py && api->py->free_threaded;
    enum shim_gc_caller caller;
    tls_way = shim_gc_policy_decide(free_threaded, &caller);
    shim_debug("python_gc: failing call from %s: %s", shim_gc_caller_name(caller),
               tls_way == SHIM_GC_WAY_NONE     ? "no collection"
               : tls_way == SHIM_GC_WAY_INLINE ? "inline only"
               : tls_way == SHIM_GC_WAY_THREAD ? "on the GC thread"
                                               : "inline or on the GC thread");
    /* Inline only, on a thread without the GIL: no collection here, and no
     * wait for another thread's either (its finalizers may need the lock
     * this caller holds). */
    if (tls_way == SHIM_GC_WAY_INLINE && api) {
        enum shim_py_attach a = shim_py_attachment(api);
        if (a != SHIM_PY_ATTACHED_MAIN && a != SHIM_PY_ATTACHED_SUB)
            tls_way = SHIM_GC_WAY_NONE;
    }
    if (tls_way == SHIM_GC_WAY_NONE) {
        atomic_fetch_add(&st.refused[caller], 1);
        return false;
    }
    return true;
}

static void pressure_cb(spyreshim_lock *lock, size_t want, void *user)
{
    (void)user;
    spyreshim_lock_release(lock);
    uint64_t t0 = shim_now_ns();
    atomic_fetch_add(&st.events, 1);
    run_event(want);
    atomic_fetch_add(&st.event_ns, shim_now_ns() - t0);
    spyreshim_lock_acquire(lock);
}

void shim_pygc_init(void)
{
    const shim_options *o = shim_opts();
    if (!o->gc)
        return;
    timeout_ms = o->gc_timeout_ms ? o->gc_timeout_ms : 1;
    unsigned gate_ms = timeout_ms * 4 < 10000 ? 10000 : timeout_ms * 4;
    shim_gate_set_wait_ms(gate_ms > 60000 ? 60000 : gate_ms);
    shim_gcthread_set_observer(thread_observer);
    shim_progress_set_source(shim_collect_progress);
    shim_pressure_set_wait_hooks(shim_pygc_detach, shim_pygc_reattach);
    shim_gc_policy_init();
    shim_pressure_set_gate(gate);
    if (spyreshim_register_pressure_callback(pressure_cb, NULL) != 0) {
        shim_warn("python_gc: cannot register the pressure callback");
        return;
    }
    atomic_store(&enabled, true);
}

static __thread shim_pytstate *detached_ts;
static __thread const shim_pyapi *detached_api;

void *shim_pygc_detach(void)
{
    if (!atomic_load(&enabled) || detached_api)
        return NULL;
    const shim_pyapi *api = shim_pyapi_get();
    if (!api)
        return NULL;
    if (!api->pypy && (!api->is_initialized() || api->is_finalizing()))
        return NULL;
    enum shim_py_attach a = shim_py_attachment(api);
    if (a != SHIM_PY_ATTACHED_MAIN && a != SHIM_PY_ATTACHED_SUB)
        return NULL;
    if (api->pypy && api->is_finalizing())
        return NULL;
    if (api->pypy)
        shim_pypy_threads_init(api);
    atomic_fetch_add(&st.detaches, 1);
    detached_ts = api->save_thread();
    detached_api = api;
    return (void *)&detached_api;
}

void shim_pygc_reattach(void *token)
{
    if (!token || !detached_api)
        return;
    const shim_pyapi *api = detached_api;
    shim_pytstate *ts = detached_ts;
    detached_api = NULL;
    detached_ts = NULL;
    api->restore_thread(ts);
}

void shim_pygc_add_stats(spyreshim_stats *s)
{
    s->gc_collections += atomic_load(&st.collections);
    s->gc_time_ns += atomic_load(&st.collect_ns);
    s->gc_recovered_bytes += atomic_load(&st.recovered);
    s->gc_timeouts += atomic_load(&st.timeouts);
    uint64_t skipped = 0;
    for (int i = 0; i < SKIP_COUNT; i++)
        skipped += atomic_load(&st.skipped[i]);
    s->gc_skipped += skipped;
    s->gc_backoff_skips += atomic_load(&st.backoff_skips);
}

void shim_pygc_write_json(FILE *f)
{
    const shim_pyapi *api = shim_pyapi_cached();
    fprintf(f, ",\n  \"gc_enabled\": %s", atomic_load(&enabled) ? "true" : "false");
    if (api)
        fprintf(f, ",\n  \"gc_interpreter\": \"%s %d.%d.%d%s\"",
                api->pypy ? "PyPy" : "CPython", api->py->major, api->py->minor,
                api->py->micro, api->py->free_threaded ? " free-threaded" : "");
    else
        fprintf(f, ",\n  \"gc_interpreter\": null");
    fprintf(f, ",\n  \"gc_events\": %" PRIu64, atomic_load(&st.events));
    fprintf(f, ",\n  \"gc_event_ns\": %" PRIu64, atomic_load(&st.event_ns));
    fprintf(f, ",\n  \"gc_inline_collections\": %" PRIu64, atomic_load(&st.inline_collections));
    fprintf(f, ",\n  \"gc_thread_collections\": %" PRIu64, atomic_load(&st.thread_collections));
    fprintf(f, ",\n  \"gc_max_collect_ns\": %" PRIu64, atomic_load(&st.max_collect_ns));
    fprintf(f, ",\n  \"gc_events_without_python\": %" PRIu64, atomic_load(&st.no_python));
    fprintf(f, ",\n  \"gc_detached_waits\": %" PRIu64, atomic_load(&st.detaches));
    fprintf(f, ",\n  \"gc_skipped_by_reason\": {");
    for (int i = 0; i < SKIP_COUNT; i++)
        fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", skip_names[i],
                atomic_load(&st.skipped[i]));
    fprintf(f, "}");
    static const char *const modes[] = {"auto", "inline", "thread", "off"};
    fprintf(f, ",\n  \"gc_mode\": \"%s\"", modes[shim_opts()->gc_mode & 3]);
    fprintf(f, ",\n  \"gc_refused_by_caller\": {");
    for (int i = 0; i < SHIM_GC_CALLER_COUNT; i++)
        fprintf(f, "%s\"%s\": %" PRIu64, i ? ", " : "", shim_gc_caller_name(i),
                atomic_load(&st.refused[i]));
    fprintf(f, "}");
    fprintf(f, ",\n  \"gc_episode_skips\": %" PRIu64, atomic_load(&st.episode_skips));
    fprintf(f, ",\n  \"gc_inline_only_skips\": %" PRIu64, atomic_load(&st.way_skips));
    fprintf(f, ",\n  \"gc_capture_refusals\": %" PRIu64, shim_pressure_capture_refusals());
    uint64_t until = atomic_load(&backoff_until);
    fprintf(f, ",\n  \"gc_backoff\": {\"level\": %u, \"active\": %s}",
            atomic_load(&backoff_level), until > shim_now_ns() ? "true" : "false");
    fprintf(f, ",\n  \"gc_interpreter_cycles\": %lu", shim_gate_cycles());
}

void shim_pygc_atfork_child(void)
{
    shim_python_find_atfork_child();
    shim_pyapi_atfork_child();
    shim_gcthread_atfork_child();
    shim_collect_atfork_child();
    shim_gate_atfork_child();
}
