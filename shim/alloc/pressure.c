/* Pressure callbacks and the pressure event.
 *
 * Locks: the registry has its own leaf mutex, held only to copy or edit the
 * table and the list of runs in flight, never while a callback runs. A
 * pressure event runs with the owning device's allocator lock held on entry
 * and exit; callbacks release it around anything that blocks, which is what
 * lets frees from other threads (and from finalizers on this one) go
 * through meanwhile.
 *
 * Only one event per device runs at a time: a thread that hits pressure
 * while another thread's event runs waits for that event to end and then
 * retries, instead of starting a second collection. That wait is bounded
 * by the event's progress (progress.h: SPYRESHIM_GC_TIMEOUT_MS in which
 * no collection used CPU, or the cap): the event's callback may need a
 * lock the waiting thread holds (a framework's lock, or one a finalizer
 * takes); past the bound that one request fails with out-of-memory
 * (pressure_wait_timeouts).
 *
 * Unregistering quiesces: every callback run is listed (registry_mu) while
 * it runs, and spyreshim_unregister_pressure_callback waits until no other
 * thread runs that (fn, user) any more; a callback that unregisters itself
 * does not wait for itself.
 * Locks, their order and fork: docs/locking.md. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "log.h"
#include "mutex.h"
#include "options.h"
#include "pressure.h"
#include "progress.h"

#define MAX_CALLBACKS 32

struct entry {
    spyreshim_pressure_fn fn;
    void *user;
};

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct entry registry[MAX_CALLBACKS];
static size_t registry_len;

/* One callback run in flight, on the running thread's stack, listed under
 * registry_mu for as long as the callback runs. */
struct run {
    struct entry e;
    pthread_t thread;
    struct run *next;
};
static struct run *running;
/* Signalled (registry_mu) when a run ends: unregister waits on it. */
static pthread_cond_t run_ended = PTHREAD_COND_INITIALIZER;

/* Bytes freed so far, all devices (the shards' counters, summed by
 * device.c: a shared atomic added to on every free would be a contended
 * line). */
static _Atomic(shim_pressure_freed_fn) freed_source;

/* Around a wait for another thread's event: set once by python_gc at init
 * (the allocator knows nothing of Python), read on every wait. */
static _Atomic(shim_pressure_detach_fn) wait_detach;
static _Atomic(shim_pressure_reattach_fn) wait_reattach;

/* The policy gate (python_gc) and the capture query (hooks/cuda_driver.c):
 * set once at init, asked on the failure path only. */
static _Atomic(shim_pressure_gate_fn) gate_hook;
static _Atomic(shim_pressure_capture_fn) capture_query;
static _Atomic uint64_t capture_refusals, gate_refusals;

void shim_pressure_set_gate(shim_pressure_gate_fn fn)
{
    atomic_store(&gate_hook, fn);
}

void shim_pressure_set_capture_query(shim_pressure_capture_fn fn)
{
    atomic_store(&capture_query, fn);
}

uint64_t shim_pressure_capture_refusals(void)
{
    return atomic_load_explicit(&capture_refusals, memory_order_relaxed);
}

uint64_t shim_pressure_gate_refusals(void)
{
    return atomic_load_explicit(&gate_refusals, memory_order_relaxed);
}

/* The trace's markers: set once at init, NULL while tracing is off. */
static _Atomic(shim_pressure_event_fn) event_hook;

void shim_pressure_set_event_hook(shim_pressure_event_fn fn)
{
    atomic_store(&event_hook, fn);
}

static _Atomic(shim_pressure_collection_fn) collection_watch;

void shim_pressure_set_collection_watch(shim_pressure_collection_fn fn)
{
    atomic_store(&collection_watch, fn);
}

/* Collections in flight, for the out-of-memory verdict: how many, since
 * when (the start of the one that made the count leave 0), and, for a
 * request that failed during one, what was freed from that failure to
 * the end of the collections then in flight: memory the program no longer
 * reached, which the collection would have given it. Marks are +1 so that
 * 0 means none. Atomics: the failure path and collectors, no lock. */
static _Atomic unsigned collections_in_flight;
static _Atomic uint64_t collections_since_ns;
static _Atomic uint64_t failure_mark, failure_outcome;

void shim_pressure_collection_begin(void)
{
    if (atomic_fetch_add(&collections_in_flight, 1) == 0)
        atomic_store(&collections_since_ns, shim_now_ns());
    shim_pressure_collection_fn fn = atomic_load_explicit(&collection_watch, memory_order_acquire);
    if (fn)
        fn(true, 0, 0, 0);
}

void shim_pressure_collection_end(uint64_t ns, uint64_t freed, long objects)
{
    /* Never below 0: a fork child forgot the parent's other threads'
     * collections, and a collection of its forking thread may end here. */
    unsigned n = atomic_load(&collections_in_flight);
    while (n && !atomic_compare_exchange_weak(&collections_in_flight, &n, n - 1))
        ;
    if (n == 1) {
        uint64_t mark = atomic_exchange(&failure_mark, 0);
        if (mark)
            atomic_store(&failure_outcome, shim_pressure_freed_total() - (mark - 1) + 1);
    }
    shim_pressure_collection_fn fn = atomic_load_explicit(&collection_watch, memory_order_acquire);
    if (fn)
        fn(false, ns, freed, objects);
}

bool shim_pressure_failed_during_collection(uint64_t *running_ns)
{
    if (atomic_load(&collections_in_flight) == 0)
        return false;
    uint64_t since = atomic_load(&collections_since_ns);
    uint64_t now = shim_now_ns();
    *running_ns = now > since ? now - since : 0;
    atomic_store(&failure_outcome, 0);
    atomic_store(&failure_mark, shim_pressure_freed_total() + 1);
    return true;
}

bool shim_pressure_failure_outcome(uint64_t *freed)
{
    uint64_t v = atomic_load(&failure_outcome);
    if (v)
        *freed = v - 1;
    return v != 0;
}

/* Depth of pressure work on this thread: running an event's callbacks, or
 * serving one (the GC thread). Non-zero means an allocation must not start
 * another event. */
static __thread unsigned tls_in_event;
static __thread bool tls_give_up;

SPYRESHIM_API int spyreshim_register_pressure_callback(spyreshim_pressure_fn fn, void *user)
{
    if (!fn)
        return -1;
    int rc = -1;
    shim_mutex_lock(&registry_mu);
    for (size_t i = 0; i < registry_len; i++) {
        if (registry[i].fn == fn && registry[i].user == user) {
            rc = 0;
            goto out;
        }
    }
    if (registry_len < MAX_CALLBACKS) {
        registry[registry_len++] = (struct entry){fn, user};
        rc = 0;
    }
out:
    shim_mutex_unlock(&registry_mu);
    return rc;
}

static bool runs_elsewhere(struct entry e)
{
    for (const struct run *r = running; r; r = r->next)
        if (r->e.fn == e.fn && r->e.user == e.user && !pthread_equal(r->thread, pthread_self()))
            return true;
    return false;
}

SPYRESHIM_API int spyreshim_unregister_pressure_callback(spyreshim_pressure_fn fn, void *user)
{
    int rc = -1;
    shim_mutex_lock(&registry_mu);
    for (size_t i = 0; i < registry_len; i++) {
        if (registry[i].fn == fn && registry[i].user == user) {
            memmove(&registry[i], &registry[i + 1], (registry_len - i - 1) * sizeof registry[0]);
            registry_len--;
            rc = 0;
            break;
        }
    }
    /* Quiesce: no event copies the entry any more; wait for the runs that
     * did (the promise of spyreshim.h: `user` may be freed on return). Not
     * for a run on this thread: the callback unregistering itself. */
    while (rc == 0 && runs_elsewhere((struct entry){fn, user}))
        pthread_cond_wait(&run_ended, &registry_mu);
    shim_mutex_unlock(&registry_mu);
    return rc;
}

void shim_pressure_set_wait_hooks(shim_pressure_detach_fn detach, shim_pressure_reattach_fn reattach)
{
    atomic_store(&wait_reattach, reattach);
    atomic_store(&wait_detach, detach);
}

void shim_pressure_atfork_prepare(void) { shim_mutex_lock(&registry_mu); }
void shim_pressure_atfork_parent(void) { shim_mutex_unlock(&registry_mu); }
void shim_pressure_atfork_child(void)
{
    /* Runs of threads that do not exist here never end: forget them (the
     * forking thread's own run, if it forked from a callback, stays). */
    struct run **pp = &running;
    while (*pp) {
        if (pthread_equal((*pp)->thread, pthread_self()))
            pp = &(*pp)->next;
        else
            *pp = (*pp)->next;
    }
    pthread_cond_init(&run_ended, NULL);
    /* The collections in flight were other threads' (one of this thread's
     * that ends here finds the count at 0 and leaves it). */
    atomic_store(&collections_in_flight, 0);
    atomic_store(&failure_mark, 0);
    shim_mutex_unlock(&registry_mu);
}

void shim_pressure_state_init(shim_pressure_state *ps)
{
    memset(ps, 0, sizeof *ps);
    shim_cond_init_monotonic(&ps->done);
}

void shim_pressure_state_atfork_child(shim_pressure_state *ps)
{
    /* An event of a thread that does not exist in the child would never
     * end: nobody is running it here. */
    ps->active = false;
    shim_cond_init_monotonic(&ps->done);
}

bool shim_pressure_in_event(void)
{
    return tls_in_event != 0;
}

void shim_pressure_enter_service(void)
{
    tls_in_event++;
}

void shim_pressure_leave_service(void)
{
    if (tls_in_event)
        tls_in_event--;
}

void shim_pressure_give_up(void)
{
    tls_give_up = true;
}

void shim_pressure_set_freed_source(shim_pressure_freed_fn fn)
{
    atomic_store_explicit(&freed_source, fn, memory_order_relaxed);
}

/* Watched memory charged to a limit and given back (passthrough.c). */
_Atomic uint64_t shim_pressure_watched_freed;

uint64_t shim_pressure_freed_total(void)
{
    shim_pressure_freed_fn fn = atomic_load_explicit(&freed_source, memory_order_relaxed);
    return (fn ? fn() : 0) + atomic_load_explicit(&shim_pressure_watched_freed, memory_order_relaxed);
}

static void check_contract(spyreshim_lock *lock, spyreshim_pressure_fn fn)
{
    if (shim_lock_held_by_me(lock))
        return;
#ifndef NDEBUG
    shim_log(SHIM_LOG_WARN,
             "pressure callback %p returned without re-acquiring the allocator lock "
             "(contract: spyreshim_lock_acquire before returning)", (void *)(uintptr_t)fn);
    abort();
#else
    static _Atomic bool warned;
    if (!atomic_exchange(&warned, true))
        shim_log(SHIM_LOG_WARN,
                 "pressure callback %p returned without re-acquiring the allocator lock; "
                 "re-acquiring it for the callback", (void *)(uintptr_t)fn);
    shim_lock_acquire(lock);
#endif
}

/* Another thread's event is running: waits for it to end, bounded by its
 * progress (progress.h). Entered and left with `lock` held; released
 * around the wait hooks and while waiting. */
static enum shim_relief wait_for_event(shim_pressure_state *ps, spyreshim_lock *lock)
{
    uint64_t gen = ps->generation;
    ps->waits++;
    /* A thread attached to Python must not wait while attached: the
     * event it waits for may need the GIL (inline collections drop it
     * between bytecodes; the GC thread needs it) or stop the world
     * (free-threaded builds). Both detaching (it may look for the
     * interpreter: the loader's lock) and re-attaching (the GIL) happen
     * without the allocator lock. */
    shim_lock_release(lock);
    shim_pressure_detach_fn detach = atomic_load(&wait_detach);
    shim_pressure_reattach_fn reattach = atomic_load(&wait_reattach);
    void *py = detach ? detach() : NULL;
    shim_lock_acquire(lock);
    unsigned ms = shim_opts()->gc_timeout_ms ? shim_opts()->gc_timeout_ms : 1;
    shim_progress_wait w;
    shim_progress_wait_begin(&w, ms);
    bool timed_out = false;
    while (ps->active && ps->generation == gen && !timed_out)
        timed_out = shim_lock_timedwait(lock, &ps->done, &w.deadline) == ETIMEDOUT &&
                    ps->active && ps->generation == gen && !shim_progress_wait_extend(&w);
    if (timed_out)
        ps->wait_timeouts++;
    if (py && reattach) {
        shim_lock_release(lock);
        reattach(py);
        shim_lock_acquire(lock);
    }
    if (timed_out) {
        shim_debug("pressure: another thread's event made no progress for %u ms (%.0f ms in "
                   "all); failing this request", ms, shim_progress_wait_ms(&w));
        return SHIM_RELIEF_NONE;
    }
    return SHIM_RELIEF_WAITED;
}

/* Runs callback `e` of an event's copy of the registry, listed as running
 * (so that unregistering it waits for this run), unless it was
 * unregistered since the copy: then its unregister may have returned
 * already, and `user` be gone. */
static void run_callback(shim_pressure_state *ps, spyreshim_lock *lock, struct entry e,
                         size_t want)
{
    struct run r = {.e = e, .thread = pthread_self()};
    bool live = false;
    shim_mutex_lock(&registry_mu);
    for (size_t j = 0; j < registry_len && !live; j++)
        live = registry[j].fn == r.e.fn && registry[j].user == r.e.user;
    if (live) {
        r.next = running;
        running = &r;
    }
    shim_mutex_unlock(&registry_mu);
    if (!live)
        return;
    ps->callback_runs++;
    e.fn(lock, want, e.user);
    check_contract(lock, e.fn);
    shim_mutex_lock(&registry_mu);
    for (struct run **pp = &running; *pp; pp = &(*pp)->next) {
        if (*pp == &r) {
            *pp = r.next;
            break;
        }
    }
    pthread_cond_broadcast(&run_ended);
    shim_mutex_unlock(&registry_mu);
}

/* Runs one pressure event on this thread: every callback registered now,
 * in registration order, until one gives up. Entered and left with
 * `lock` held (callbacks release it around what blocks); other threads
 * that hit pressure meanwhile wait for it (wait_for_event). */
static enum shim_relief run_event(shim_pressure_state *ps, spyreshim_lock *lock, size_t want)
{
    struct entry cbs[MAX_CALLBACKS];
    shim_mutex_lock(&registry_mu);
    size_t n = registry_len;
    memcpy(cbs, registry, n * sizeof cbs[0]);
    shim_mutex_unlock(&registry_mu);

    ps->active = true;
    ps->events++;
    tls_in_event++;
    tls_give_up = false;
    uint64_t before = shim_pressure_freed_total();
    shim_pressure_event_fn ev = atomic_load_explicit(&event_hook, memory_order_relaxed);
    if (ev)
        ev(true, want);

    for (size_t i = 0; i < n && !tls_give_up; i++)
        run_callback(ps, lock, cbs[i], want);

    ps->recovered_bytes += shim_pressure_freed_total() - before;
    if (ev)
        ev(false, shim_pressure_freed_total() - before);
    tls_in_event--;
    bool retry = !tls_give_up;
    tls_give_up = false;
    ps->active = false;
    ps->generation++;
    pthread_cond_broadcast(&ps->done);
    return retry && n > 0 ? SHIM_RELIEF_RAN : SHIM_RELIEF_NONE;
}

/* Whether this request may run or wait for pressure work: not during a
 * stream capture, not when the policy gate says the caller holds a lock a
 * collection would need. Entered and left with `lock` held; released
 * around both questions (the gate unwinds and asks the loader). */
static bool admitted(spyreshim_lock *lock, size_t want)
{
    shim_pressure_capture_fn capturing = atomic_load(&capture_query);
    shim_pressure_gate_fn gate = atomic_load(&gate_hook);
    if (!capturing && !gate)
        return true;
    shim_lock_release(lock);
    bool ok = true;
    if (capturing && capturing()) {
        atomic_fetch_add_explicit(&capture_refusals, 1, memory_order_relaxed);
        ok = false;
    } else if (gate && !gate(want)) {
        atomic_fetch_add_explicit(&gate_refusals, 1, memory_order_relaxed);
        ok = false;
    }
    shim_lock_acquire(lock);
    return ok;
}

enum shim_relief shim_pressure_relieve(shim_pressure_state *ps, spyreshim_lock *lock, size_t want)
{
    if (tls_in_event)
        return SHIM_RELIEF_NONE; /* nested: an allocation made by pressure work itself */
    if (!admitted(lock, want))
        return SHIM_RELIEF_NONE;
    if (ps->active)
        return wait_for_event(ps, lock);
    return run_event(ps, lock, want);
}
