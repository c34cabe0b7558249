/* A device's arenas (SPYRESHIM_ARENAS): a thread that finds its arena busy
 * moves to one of its own; blocks are freed wherever they were served
 * from, whatever thread frees them; the limit is one for all arenas; a
 * request its own arena cannot serve is served by another; statistics
 * stay exact; fork takes every arena's lock.
 *
 * Contention is made deterministic: the runtime's allocation (called
 * while an arena's lock is held, to reserve a region) can be made to wait
 * at a gate, so a second thread always finds that arena busy. */
#include <criterion/criterion.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sleeping.h"
#include "fake_runtime.h"
#include "options.h"

#define MB ((size_t)1 << 20)

/* The gate: while `gate_armed`, the runtime's next allocation announces
 * itself (`gate_entered`) and waits until the test opens it. */
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static bool gate_armed, gate_entered, gate_open;

static int gated_malloc(void **p, size_t size)
{
    pthread_mutex_lock(&gate_mu);
    if (gate_armed) {
        gate_armed = false;
        gate_entered = true;
        pthread_cond_broadcast(&gate_cv);
        while (!gate_open)
            pthread_cond_wait(&gate_cv, &gate_mu);
    }
    pthread_mutex_unlock(&gate_mu);
    return fake_malloc(p, size);
}

static shim_runtime gated_rt = {
    .name = "gated", .err_invalid = 1, .err_oom = 2, .alignment = 256,
    .real_malloc = gated_malloc, .real_free = fake_free, .real_mem_info = fake_mem_info,
};

static shim_device *dev;

static spyreshim_stats stats_of(shim_device *d)
{
    spyreshim_stats s = {.size = sizeof s};
    shim_device_add_stats(d, &s);
    return s;
}

struct req {
    size_t size;
    void *ptr;
    int rc;
};

static void *alloc_thread(void *arg)
{
    struct req *r = arg;
    r->rc = shim_device_malloc(dev, &r->ptr, r->size);
    return NULL;
}

static void *free_thread(void *arg)
{
    struct req *r = arg;
    r->rc = shim_device_free(dev, r->ptr);
    return NULL;
}

struct waiter {
    struct req *r;
    _Atomic pid_t tid;
    _Atomic bool done;
};

static void *waiting_alloc_thread(void *arg)
{
    struct waiter *w = arg;
    atomic_store(&w->tid, gettid());
    alloc_thread(w->r);
    atomic_store(&w->done, true);
    return NULL;
}

/* Thread A's allocation reserves a region and waits in the runtime with
 * its arena locked; thread B then allocates and finds that arena busy.
 * The gate opens once B is done or asleep (on a lock: it has tried A's
 * arena by then, whatever it does next). Returns after both are done:
 * whether B was done first (it did not wait for A). */
static bool contend(struct req *a, struct req *b)
{
    gate_armed = true;
    gate_entered = gate_open = false;
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, alloc_thread, a), 0);
    pthread_mutex_lock(&gate_mu);
    while (!gate_entered)
        pthread_cond_wait(&gate_cv, &gate_mu);
    pthread_mutex_unlock(&gate_mu);
    struct waiter w = {.r = b};
    cr_assert_eq(pthread_create(&tb, NULL, waiting_alloc_thread, &w), 0);
    while (!atomic_load(&w.done) && !(atomic_load(&w.tid) && thread_sleeping(atomic_load(&w.tid))))
        sched_yield();
    bool b_first = atomic_load(&w.done);
    pthread_mutex_lock(&gate_mu);
    gate_open = true;
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    return b_first;
}

/* contend(), both requests served. */
static bool contend_ok(struct req *a, struct req *b)
{
    bool b_first = contend(a, b);
    cr_assert_eq(a->rc, 0);
    cr_assert_eq(b->rc, 0);
    return b_first;
}

static void setup(const char *arenas, const char *limit, size_t capacity)
{
    setenv("SPYRESHIM_ARENAS", arenas, 1);
    if (limit)
        setenv("SPYRESHIM_LIMIT", limit, 1);
    setenv("SPYRESHIM_REGION_SIZE", "4M", 1);
    shim_options_reload();
    fake.capacity = capacity;
    fake.next = FAKE_BASE;
    dev = shim_device_get(&gated_rt);
    cr_assert_not_null(dev);
}

Test(shards, busy_arena_sends_the_thread_to_one_of_its_own)
{
    setup("2", NULL, 256 * MB);
    /* A's block fills its region: B's arena has to reserve its own. */
    struct req a = {.size = 4 * MB}, b = {.size = MB};
    contend_ok(&a, &b);
    cr_assert_neq(a.ptr, b.ptr);
    spyreshim_stats s = stats_of(dev);
    cr_assert_eq(s.arenas, 2);
    cr_assert_eq(s.regions, 2, "each arena reserved its own region (%lu)", (unsigned long)s.regions);
    cr_assert_eq(s.used_bytes, 5 * MB);
    cr_assert_eq(s.peak_used_bytes, 5 * MB);

    /* The second arena's block freed by this thread (its arena is the
     * first), the first arena's by a new thread. */
    cr_assert_eq(shim_device_free(dev, b.ptr), 0);
    struct req fa = {.ptr = a.ptr};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_thread, &fa), 0);
    pthread_join(t, NULL);
    cr_assert_eq(fa.rc, 0);
    /* Freed once: a second free is a double free, whichever arena. */
    cr_assert_eq(shim_device_free(dev, a.ptr), 1);
    cr_assert_eq(shim_device_free(dev, b.ptr), 1);
    s = stats_of(dev);
    cr_assert_eq(s.allocs, 2);
    cr_assert_eq(s.frees, 2);
    cr_assert_eq(s.used_bytes, 0);
    cr_assert_eq(s.invalid_frees, 2);
    /* The peak is the device's across arenas: 5 MiB, then 6. */
    void *p, *q;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 0);
    cr_assert_eq(stats_of(dev).peak_used_bytes, 5 * MB);
    cr_assert_eq(shim_device_malloc(dev, &q, 5 * MB), 0);
    cr_assert_eq(stats_of(dev).peak_used_bytes, 6 * MB);
    cr_assert_eq(shim_device_free(dev, p), 0);
    cr_assert_eq(shim_device_free(dev, q), 0);
}

Test(shards, one_arena_when_told)
{
    setup("1", NULL, 256 * MB);
    struct req a = {.size = MB}, b = {.size = MB};
    contend_ok(&a, &b);
    spyreshim_stats s = stats_of(dev);
    cr_assert_eq(s.arenas, 1);
    cr_assert_eq(s.regions, 1);
}

Test(shards, the_limit_is_one_for_all_arenas_and_another_arena_serves)
{
    /* Limit 8 MiB, regions of 4 MiB: however the two arenas share the
     * blocks, together they reserve no more than the limit. */
    setup("2", "8M", 256 * MB);
    struct req a = {.size = MB}, b = {.size = MB};
    contend_ok(&a, &b);
    void *p[16];
    int n = 0;
    while (n < 16 && shim_device_malloc(dev, &p[n], MB) == 0)
        n++;
    cr_assert_eq(n, 6, "8 MiB limit, 2 MiB live: %d more 1 MiB blocks served, not 6", n);
    spyreshim_stats s = stats_of(dev);
    cr_assert_eq(s.arenas, 2);
    cr_assert_leq(s.peak_reserved_bytes, 8 * MB);
    cr_assert_eq(s.used_bytes, 8 * MB);
    cr_assert_eq(s.failed_allocs, 1);
    for (int i = 0; i < n; i++)
        cr_assert_eq(shim_device_free(dev, p[i]), 0);
    cr_assert_eq(shim_device_free(dev, a.ptr), 0);
    cr_assert_eq(shim_device_free(dev, b.ptr), 0);
    s = stats_of(dev);
    cr_assert_eq(s.used_bytes, 0);
    cr_assert_eq(s.allocs, s.frees);
}

Test(shards, empty_regions_of_another_arena_are_given_back_for_a_request)
{
    /* Limit 8 MiB, regions of 4 MiB: each arena holds one. Freed, A's
     * region stays cached empty in A's arena; a 6 MiB request (more than
     * either region) fits under the limit only once that region is
     * released. */
    setup("2", "8M", 256 * MB);
    struct req a = {.size = 4 * MB}, b = {.size = MB};
    contend_ok(&a, &b);
    cr_assert_eq(stats_of(dev).regions, 2);
    cr_assert_eq(shim_device_free(dev, a.ptr), 0);
    cr_assert_eq(shim_device_free(dev, b.ptr), 0);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, 6 * MB), 0);
    spyreshim_stats s = stats_of(dev);
    cr_assert_leq(s.reserved_bytes, 8 * MB);
    cr_assert_geq(s.regions_released, 1);
    cr_assert_eq(shim_device_free(dev, p), 0);
}

Test(shards, fork_takes_every_arena_and_the_child_frees_across_them)
{
    setup("2", NULL, 256 * MB);
    struct req a = {.size = 4 * MB}, b = {.size = MB};
    contend_ok(&a, &b);
    cr_assert_eq(stats_of(dev).regions, 2);
    /* The library's own fork handlers (installed once the device served
     * its first request) take and release every lock. */
    pid_t pid = fork();
    if (pid == 0) {
        void *q;
        int ok = shim_device_malloc(dev, &q, MB) == 0 && shim_device_free(dev, q) == 0 &&
                 shim_device_free(dev, a.ptr) == 0 && shim_device_free(dev, b.ptr) == 0;
        spyreshim_stats s = stats_of(dev);
        _exit(ok && s.used_bytes == 0 && s.arenas == 2 ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cr_assert_eq(shim_device_free(dev, a.ptr), 0);
    cr_assert_eq(shim_device_free(dev, b.ptr), 0);
}

Test(shards, a_bad_value_falls_back_to_the_default)
{
    setenv("SPYRESHIM_ARENAS", "99", 1);
    shim_options_reload();
    cr_assert_eq(shim_opts()->arenas, 0, "bad value kept: %u", shim_opts()->arenas);
}

Test(shards, free_blocks_of_an_idle_arena_come_before_a_new_region)
{
    /* A's block fills arena 0's only region; B's arena reserves a region
     * of its own for 1 MiB. Then a request of this thread (arena 0) is
     * served from B's region, not from a new one. */
    setup("2", NULL, 256 * MB);
    struct req a = {.size = 4 * MB}, b = {.size = MB};
    contend_ok(&a, &b);
    /* Two arenas, a region each: with one arena, its second region would
     * serve the request below and the test would prove nothing. */
    cr_assert_eq(stats_of(dev).arenas, 2, "B's request made no arena of its own");
    cr_assert_eq(stats_of(dev).regions, 2);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, 2 * MB), 0);
    spyreshim_stats s = stats_of(dev);
    cr_assert_eq(s.arenas, 2);
    cr_assert_eq(s.regions, 2, "a region reserved while another arena had room");
    cr_assert_eq(s.used_bytes, 7 * MB);
    cr_assert_eq(shim_device_free(dev, p), 0);
    cr_assert_eq(shim_device_free(dev, a.ptr), 0);
    cr_assert_eq(shim_device_free(dev, b.ptr), 0);
}

Test(shards, a_thread_arriving_after_the_last_arena_was_made_takes_one_no_thread_uses)
{
    /* Round one makes arena 1 for B; B exits. Round two: two new threads
     * meet on arena 0 (new threads start there); the one that finds it
     * busy takes arena 1, which no running thread uses, instead of
     * waiting on arena 0 for good. */
    setup("2", NULL, 256 * MB);
    struct req a = {.size = MB}, b = {.size = MB};
    cr_assert(contend_ok(&a, &b), "B waited for A with an arena to spare");
    struct req c = {.size = 4 * MB}, e = {.size = MB}; /* c needs a region: the gate */
    cr_assert(contend_ok(&c, &e), "the second round's thread waited on the busy arena");
    cr_assert_eq(stats_of(dev).arenas, 2);
    void *ptrs[] = {a.ptr, b.ptr, c.ptr, e.ptr};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(shim_device_free(dev, ptrs[i]), 0);
}
