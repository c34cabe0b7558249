/* Running the interpreter's cyclic collector, GIL held.
 *
 * Owns the collections' CPU time (the progress that bounds the waits for
 * them, shim/alloc/progress.c), guarded by prog_mu, a leaf held only to
 * read or edit that table (waiters read it with an allocator lock held;
 * a collector never holds it across anything else). Takes no other lock
 * of the shim's (a free-threaded collection stops the world, and
 * finalizers it runs free device memory through the allocator lock).
 * Calls gc.collect rather than PyGC_Collect: the latter silently does
 * nothing once a program called gc.disable(), which many training scripts
 * do. */
#include <pthread.h>
#include <stdbool.h>
#include <time.h>

#include "clock.h"
#include "collect.h"
#include "pressure.h"

/* Collections in flight at once: one per thread that collects for the
 * shim (the GC thread, and threads attached to Python collecting inline).
 * Past that, a collection's CPU time is not seen until it ends. */
#define MAX_COLLECTORS 16

static pthread_mutex_t prog_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    clockid_t clock;   /* the collecting thread's CPU clock */
    uint64_t start;    /* its reading when the collection began */
    bool used;
} collectors[MAX_COLLECTORS];
static uint64_t finished_ns;   /* CPU time of the collections that ended */

static uint64_t cpu_ns(clockid_t c)
{
    struct timespec ts;
    if (clock_gettime(c, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The calling thread begins a collection: its slot, or -1. */
static int collector_enter(void)
{
    clockid_t c;
    if (pthread_getcpuclockid(pthread_self(), &c) != 0)
        return -1;
    uint64_t start = cpu_ns(c);
    int slot = -1;
    pthread_mutex_lock(&prog_mu);
    for (int i = 0; i < MAX_COLLECTORS && slot < 0; i++) {
        if (!collectors[i].used) {
            collectors[i].clock = c;
            collectors[i].start = start;
            collectors[i].used = true;
            slot = i;
        }
    }
    pthread_mutex_unlock(&prog_mu);
    return slot;
}

static void collector_leave(int slot)
{
    if (slot < 0)
        return;
    pthread_mutex_lock(&prog_mu);
    uint64_t now = cpu_ns(collectors[slot].clock);
    if (now > collectors[slot].start)
        finished_ns += now - collectors[slot].start;
    collectors[slot].used = false;
    pthread_mutex_unlock(&prog_mu);
}

uint64_t shim_collect_progress(void)
{
    pthread_mutex_lock(&prog_mu);
    uint64_t total = finished_ns;
    for (int i = 0; i < MAX_COLLECTORS; i++) {
        if (collectors[i].used) {
            uint64_t now = cpu_ns(collectors[i].clock);
            if (now > collectors[i].start)
                total += now - collectors[i].start;
        }
    }
    pthread_mutex_unlock(&prog_mu);
    return total;
}

void shim_collect_atfork_child(void)
{
    /* The collections in flight were other threads': none here. */
    pthread_mutex_init(&prog_mu, NULL);
    for (int i = 0; i < MAX_COLLECTORS; i++)
        collectors[i].used = false;
}

#define PYPY_MIN_ROUNDS 2
#define PYPY_MAX_ROUNDS 4

void shim_collect_with_gil(const shim_pyapi *api, shim_collect_result *r)
{
    shim_pyobj *t, *v, *tb;
    api->err_fetch(&t, &v, &tb);
    /* Outside the collection's own time: what the leak layer does at the
     * boundaries (docs/report-format.md, "collections") is its cost. */
    shim_pressure_collection_begin();
    int slot = collector_enter();
    uint64_t freed0 = shim_pressure_freed_total();
    uint64_t t0 = shim_now_ns();
    r->objects = shim_py_gc_collect(api);
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
            long more = shim_py_gc_collect(api);
            if (more > 0)
                r->objects += more;
        }
    }
    r->ns = shim_now_ns() - t0;
    r->freed = shim_pressure_freed_total() - freed0;
    collector_leave(slot);
    shim_pressure_collection_end(r->ns, r->freed, r->objects);
    api->err_restore(t, v, tb);
}
