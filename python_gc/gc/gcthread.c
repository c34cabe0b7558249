/* The GC thread: a thread the shim owns, one of the two kinds of thread on
 * which the shim ever calls PyGILState_Ensure (the other is the control
 * thread's snapshot, python_gc/stacks/pystack.c's resolve_detached).
 *
 * A thread that hits pressure without holding the GIL (a C++ worker, a
 * Python thread inside Py_BEGIN_ALLOW_THREADS, as every PyTorch op is) must
 * not wait for the GIL without bound: the GIL holder may be waiting for a
 * lock that thread holds. It hands the collection to this thread and waits
 * with a bound on the collection's progress (shim/alloc/progress.h: as
 * long as the collection keeps using CPU, however busy the machine, up to
 * SHIM_PROGRESS_CAP stretches of SPYRESHIM_GC_TIMEOUT_MS; a stretch
 * without, waiting for the GIL or blocked in a finalizer, ends it); when
 * the bound passes it gives up (its request fails, with one line saying
 * why, once per collection) and the collection completes later anyway.
 *
 * Owns: the request/completion tickets and the thread itself, guarded by
 * gct_mu, a leaf mutex never held while calling Python. Allocations made on
 * this thread (by finalizers) fail at once instead of waiting for the
 * pressure event that waits for them (shim_pressure_enter_service). The
 * thread blocks every signal. If Python kills it (PyGILState_Ensure during
 * finalization calls pthread_exit on 3.8 to 3.13.0), a cleanup handler
 * leaves the books straight and the next request starts a new one. If it
 * hangs there instead (3.13.8+ parks such a thread forever), the first
 * request after that finalization abandons it and starts a new one (at most
 * MAX_ABANDONED times); an abandoned thread that ever wakes up touches
 * nothing shared and exits.
 * Locks, their order and fork: docs/locking.md. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "gate.h"
#include "gcthread.h"
#include "log.h"
#include "mutex.h"
#include "pressure.h"
#include "progress.h"

static pthread_mutex_t gct_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t req_cv;      /* a request arrived */
static pthread_cond_t done_cv;     /* a collection completed (CLOCK_MONOTONIC) */
static pthread_once_t gct_once = PTHREAD_ONCE_INIT;
#define MAX_ABANDONED 4

static bool running;
static uint64_t thread_gen;          /* the current thread's generation */
static unsigned abandoned;
static struct job *cur_job;          /* the current thread's job, if any */
static uint64_t requested, completed;
static const shim_pyapi *req_api;
static enum shim_gcthread_status last_status;
static shim_collect_result last_result;
static _Atomic(shim_gcthread_observer) observer;
static _Atomic bool pypy_threads_ready;

static void gct_init_once(void)
{
    shim_cond_init_monotonic(&done_cv);
    pthread_cond_init(&req_cv, NULL);
}

void shim_gcthread_set_observer(shim_gcthread_observer fn)
{
    atomic_store(&observer, fn);
}

typedef struct job {
    uint64_t target;
    uint64_t gen;            /* the thread's generation */
    unsigned long cycle;     /* interpreter cycle when the job started */
    bool in_gate;            /* under gct_mu */
    bool abandoned;          /* under gct_mu */
    bool has_gil;            /* under gct_mu: collecting, not waiting for the GIL */
    bool reported;           /* under gct_mu: a requester said it gave up on it */
    bool done;
} job;

static void finish(job *j, enum shim_gcthread_status st, const shim_collect_result *r)
{
    shim_mutex_lock(&gct_mu);
    if (!j->abandoned) {
        if (completed < j->target)
            completed = j->target;
        last_status = st;
        if (r)
            last_result = *r;
        if (cur_job == j)
            cur_job = NULL;
        pthread_cond_broadcast(&done_cv);
    }
    shim_mutex_unlock(&gct_mu);
    j->done = true;
}

/* Leaves the gate unless the job was abandoned (whoever abandoned it left
 * the gate on its behalf). */
static void leave_gate(job *j)
{
    shim_mutex_lock(&gct_mu);
    bool mine = j->in_gate && !j->abandoned;
    j->in_gate = false;
    shim_mutex_unlock(&gct_mu);
    if (mine)
        shim_gate_leave();
}

/* pthread_exit from inside the interpreter: the thread is going away. */
static void on_killed(void *arg)
{
    job *j = arg;
    leave_gate(j);
    shim_pressure_leave_service();
    shim_mutex_lock(&gct_mu);
    if (j->gen == thread_gen)
        running = false;
    shim_mutex_unlock(&gct_mu);
    if (!j->done)
        finish(j, SHIM_GCT_NOT_RUNNING, NULL);
    shim_warn("python_gc: the interpreter ended the GC thread (finalizing?)");
}

static void run_one(const shim_pyapi *api, job *j)
{
    if (!api->pypy && (!api->is_initialized() || api->is_finalizing())) {
        finish(j, SHIM_GCT_NOT_RUNNING, NULL);
        return;
    }
    enum shim_gate_verdict v = shim_gate_enter(api);
    if (v == SHIM_GATE_REFUSE) {
        finish(j, SHIM_GCT_GATE_CLOSED, NULL);
        return;
    }
    shim_mutex_lock(&gct_mu);
    j->in_gate = true;
    shim_mutex_unlock(&gct_mu);
    int g = api->gil_ensure();
    shim_mutex_lock(&gct_mu);
    j->has_gil = true;
    shim_mutex_unlock(&gct_mu);
    if (api->pypy)
        shim_pypy_threads_init(api);
    enum shim_gcthread_status st = SHIM_GCT_COLLECTED;
    shim_collect_result r = { 0 };
    if (api->is_finalizing()) {
        st = SHIM_GCT_NOT_RUNNING;
    } else {
        if (v == SHIM_GATE_ADMIT_UNARMED)
            shim_gate_arm(api);
        shim_collect_with_gil(api, &r);
    }
    api->gil_release(g);
    leave_gate(j);
    if (st == SHIM_GCT_COLLECTED) {
        shim_gcthread_observer obs = atomic_load(&observer);
        if (obs)
            obs(&r);
    }
    finish(j, st, st == SHIM_GCT_COLLECTED ? &r : NULL);
}

static void *gc_thread_main(void *arg)
{
    uint64_t gen = (uint64_t)(uintptr_t)arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        shim_mutex_lock(&gct_mu);
        while (gen == thread_gen && requested == completed)
            pthread_cond_wait(&req_cv, &gct_mu);
        if (gen != thread_gen) {                 /* abandoned meanwhile */
            shim_mutex_unlock(&gct_mu);
            return NULL;
        }
        /* gct_mu -> gate_mu, the one order between the two leaf locks. */
        job j = { .target = requested, .gen = gen, .cycle = shim_gate_cycles() };
        cur_job = &j;
        const shim_pyapi *api = req_api;
        shim_mutex_unlock(&gct_mu);

        shim_pressure_enter_service();
        pthread_cleanup_push(on_killed, &j);
        run_one(api, &j);
        pthread_cleanup_pop(0);
        shim_pressure_leave_service();
    }
    return NULL;
}

/* gct_mu held. The current thread has been inside a job since before the
 * last finalization: it is parked inside the interpreter for good. */
static bool abandon_stuck_thread(unsigned long cycle_now)
{
    job *j = cur_job;
    if (!running || !j || j->cycle == cycle_now || abandoned >= MAX_ABANDONED)
        return false;
    abandoned++;
    thread_gen++;
    running = false;
    j->abandoned = true;
    cur_job = NULL;
    completed = requested;
    if (j->in_gate) {
        j->in_gate = false;
        shim_gate_leave();       /* gate_mu is a leaf: fine under gct_mu */
    }
    pthread_cond_broadcast(&req_cv);
    return true;
}

/* gct_mu held (released while waiting). Waits until `completed` reaches
 * `ticket`, bounded by the collection's progress (progress.h). */
static bool wait_progress(shim_progress_wait *w, uint64_t ticket, unsigned timeout_ms)
{
    shim_progress_wait_begin(w, timeout_ms);
    for (;;) {
        int rc = 0;
        while (completed < ticket && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&done_cv, &gct_mu, &w->deadline);
        if (completed >= ticket)
            return true;
        if (!shim_progress_wait_extend(w))
            return false;
    }
}

/* gct_mu held. Why a requester gave up on the current collection, in one
 * line, the first time one does: what the GC thread was doing (waiting for
 * the GIL, collecting without progress, collecting past the cap). Empty
 * when said already. */
static void say_why(const shim_progress_wait *w, unsigned timeout_ms, char *line, size_t cap)
{
    job *j = cur_job;
    if (j && j->reported)
        return;
    if (j)
        j->reported = true;
    double ms = shim_progress_wait_ms(w);
    if (!w->stalled)
        snprintf(line, cap, "python_gc: the collection on the GC thread still runs after "
                 "%.0f ms (%u x SPYRESHIM_GC_TIMEOUT_MS); this request fails with "
                 "out-of-memory, the collection goes on", ms, SHIM_PROGRESS_CAP);
    else if (j && j->has_gil)
        snprintf(line, cap, "python_gc: the collection on the GC thread used no CPU for "
                 "%u ms (a finalizer blocked?); this request fails with out-of-memory after "
                 "%.0f ms, the collection goes on", timeout_ms, ms);
    else
        snprintf(line, cap, "python_gc: the GC thread has waited %.0f ms for the GIL (its "
                 "holder may wait for a lock this thread holds); this request fails with "
                 "out-of-memory", ms);
}

enum shim_gcthread_status shim_gcthread_collect(const shim_pyapi *api, unsigned timeout_ms,
                                                shim_collect_result *out)
{
    pthread_once(&gct_once, gct_init_once);
    shim_mutex_lock(&gct_mu);
    if (abandon_stuck_thread(shim_gate_cycles()))
        shim_warn("python_gc: the GC thread never came back from the interpreter's "
                  "last finalization; starting another");
    if (!running) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        /* The thread inherits our signal mask for the instant before it
         * blocks everything itself; that is harmless. */
        int rc = pthread_create(&t, &a, gc_thread_main, (void *)(uintptr_t)thread_gen);
        pthread_attr_destroy(&a);
        if (rc != 0) {
            shim_mutex_unlock(&gct_mu);
            shim_warn("python_gc: cannot start the GC thread: %s", strerror(rc));
            return SHIM_GCT_NO_THREAD;
        }
        running = true;
        /* Requests a dead thread never served are void. */
        completed = requested;
    }
    req_api = api;
    uint64_t ticket = ++requested;
    pthread_cond_signal(&req_cv);
    shim_progress_wait w;
    bool done = wait_progress(&w, ticket, timeout_ms);
    enum shim_gcthread_status st = done ? last_status : SHIM_GCT_TIMEOUT;
    if (st == SHIM_GCT_COLLECTED && out)
        *out = last_result;
    char line[200] = "";
    if (!done)
        say_why(&w, timeout_ms, line, sizeof line);
    shim_mutex_unlock(&gct_mu);
    if (line[0])
        shim_warn("%s", line);
    return st;
}

bool shim_gcthread_busy(void)
{
    pthread_once(&gct_once, gct_init_once);
    shim_mutex_lock(&gct_mu);
    bool busy = running && requested != completed;
    shim_mutex_unlock(&gct_mu);
    return busy;
}

bool shim_gcthread_wait_idle(unsigned timeout_ms)
{
    pthread_once(&gct_once, gct_init_once);
    shim_mutex_lock(&gct_mu);
    shim_progress_wait w;
    if (running)
        wait_progress(&w, requested, timeout_ms);
    bool idle = !running || requested == completed;
    shim_mutex_unlock(&gct_mu);
    return idle;
}

void shim_pypy_threads_init(const shim_pyapi *api)
{
    /* Before 7.3.14, a thread that waits for a GIL nobody initialized
     * aborts the process: initialize it while holding it. */
    if (!atomic_load(&pypy_threads_ready)) {
        api->init_threads();
        atomic_store(&pypy_threads_ready, true);
    }
}

bool shim_pypy_threads_ready(void)
{
    return atomic_load(&pypy_threads_ready);
}

void shim_gcthread_atfork_child(void)
{
    pthread_mutex_init(&gct_mu, NULL);
    gct_init_once();
    running = false;
    cur_job = NULL;
    thread_gen++;
    requested = completed = 0;
}
