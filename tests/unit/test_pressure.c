/* The pressure-callback contract (shim/pressure.c through shim/device.c):
 * callbacks run at exhaustion with the allocator lock held, release and
 * re-acquire it, the request is retried, concurrent events coalesce, frees
 * re-enter, nested pressure fails fast. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>

#include "fake_runtime.h"
#include "lock.h"
#include "options.h"
#include "pressure.h"
#include "progress.h"

#define MB ((size_t)1 << 20)

static shim_device *dev;
static spyreshim_stats base; /* counters when fill() returned */
static void *blocks[4096];
static size_t nblocks;
static _Atomic unsigned calls;

/* Fills the device with 1 MiB blocks until the runtime says no. */
static void fill(size_t capacity)
{
    dev = fake_device(capacity);
    cr_assert_not_null(dev);
    void *p;
    while (shim_device_malloc(dev, &p, MB) == 0) {
        cr_assert_lt(nblocks, 4096);
        blocks[nblocks++] = p;
    }
    cr_assert_gt(nblocks, 0);
    base = (spyreshim_stats){.size = sizeof base};
    shim_device_add_stats(dev, &base);
}

/* Counters since fill() returned (filling up ends in an OOM of its own). */
static spyreshim_stats stats(void)
{
    spyreshim_stats s = {.size = sizeof s};
    shim_device_add_stats(dev, &s);
    s.pressure_events -= base.pressure_events;
    s.pressure_waits -= base.pressure_waits;
    s.callback_runs -= base.callback_runs;
    s.callback_recovered_bytes -= base.callback_recovered_bytes;
    s.failed_allocs -= base.failed_allocs;
    return s;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void cb_free_one(spyreshim_lock *lock, size_t want, void *user)
{
    (void)user;
    cr_assert(shim_lock_held_by_me(lock), "entered without the allocator lock");
    cr_assert_eq(want, MB);
    calls++;
    spyreshim_lock_release(lock);
    cr_assert(!shim_lock_held_by_me(lock));
    cr_assert_eq(shim_device_free(dev, blocks[--nblocks]), 0);
    spyreshim_lock_acquire(lock);
}

Test(pressure, callback_runs_at_exhaustion_and_retry_succeeds)
{
    fill(64 * MB);
    cr_assert_eq(spyreshim_register_pressure_callback(cb_free_one, NULL), 0);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 0);
    cr_assert_eq(calls, 1);
    spyreshim_stats s = stats();
    cr_assert_eq(s.pressure_events, 1);
    cr_assert_eq(s.callback_runs, 1);
    cr_assert_eq(s.callback_recovered_bytes, MB);
}

struct freer { void *p; int rc; };

static void *free_from_thread(void *arg)
{
    struct freer *f = arg;
    f->rc = shim_device_free(dev, f->p);
    return NULL;
}

static void cb_frees_from_other_thread(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    calls++;
    spyreshim_lock_release(lock);
    /* Another thread can take the allocator lock only if we released it. */
    struct freer f = {.p = blocks[--nblocks], .rc = -1};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_from_thread, &f), 0);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    cr_assert_eq(pthread_timedjoin_np(t, NULL, &deadline), 0,
                 "the freeing thread stayed blocked: the lock was not released");
    cr_assert_eq(f.rc, 0);
    spyreshim_lock_acquire(lock);
}

Test(pressure, lock_is_released_during_the_callback)
{
    fill(32 * MB);
    spyreshim_register_pressure_callback(cb_frees_from_other_thread, NULL);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 0);
    cr_assert_eq(calls, 1);
}

static void cb_free_with_lock_held(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    calls++;
    /* Re-entrant: the free happens before the lock is released. */
    cr_assert_eq(shim_device_free(dev, blocks[--nblocks]), 0);
    cr_assert(shim_lock_held_by_me(lock));
}

Test(pressure, free_inside_callback_with_lock_held_works)
{
    fill(32 * MB);
    spyreshim_register_pressure_callback(cb_free_with_lock_held, NULL);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 0);
    cr_assert_eq(calls, 1);
}

static void cb_nested_alloc(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    calls++;
    spyreshim_lock_release(lock);
    cr_assert(shim_pressure_in_event());
    void *q = NULL;
    /* Runs out too: must fail at once, not recurse into another event. */
    cr_assert_eq(shim_device_malloc(dev, &q, 8 * MB), 2);
    cr_assert_eq(shim_device_free(dev, blocks[--nblocks]), 0);
    spyreshim_lock_acquire(lock);
}

Test(pressure, nested_pressure_fails_fast)
{
    fill(32 * MB);
    spyreshim_register_pressure_callback(cb_nested_alloc, NULL);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 0);
    cr_assert_eq(calls, 1);
    cr_assert_eq(stats().pressure_events, 1);
}

static void cb_count(spyreshim_lock *lock, size_t want, void *user)
{
    (void)lock, (void)want;
    (*(unsigned *)user)++;
}

Test(pressure, registration_and_unregistration)
{
    fill(16 * MB);
    unsigned a = 0, b = 0;
    cr_assert_eq(spyreshim_register_pressure_callback(NULL, NULL), -1);
    cr_assert_eq(spyreshim_register_pressure_callback(cb_count, &a), 0);
    cr_assert_eq(spyreshim_register_pressure_callback(cb_count, &a), 0); /* no-op */
    cr_assert_eq(spyreshim_register_pressure_callback(cb_count, &b), 0);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 2);
    unsigned rounds = shim_opts()->pressure_rounds;
    cr_assert_eq(a, rounds, "a ran %u times, expected once per round (%u)", a, rounds);
    cr_assert_eq(b, rounds);
    cr_assert_eq(spyreshim_unregister_pressure_callback(cb_count, &a), 0);
    cr_assert_eq(spyreshim_unregister_pressure_callback(cb_count, &a), -1);
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 2);
    cr_assert_eq(a, rounds, "an unregistered callback ran");
    cr_assert_eq(b, 2 * rounds);
    cr_assert_eq(stats().failed_allocs, 2);
}

Test(pressure, without_callbacks_out_of_memory_is_immediate)
{
    fill(16 * MB);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 2);
    cr_assert_eq(stats().pressure_events, 1);
    cr_assert_eq(stats().callback_runs, 0);
}

static void cb_give_up(spyreshim_lock *lock, size_t want, void *user)
{
    (void)lock, (void)want, (void)user;
    calls++;
    shim_pressure_give_up();
}

Test(pressure, give_up_ends_the_request_after_one_round)
{
    fill(16 * MB);
    unsigned later = 0;
    spyreshim_register_pressure_callback(cb_give_up, NULL);
    spyreshim_register_pressure_callback(cb_count, &later);
    void *p;
    cr_assert_eq(shim_device_malloc(dev, &p, MB), 2);
    cr_assert_eq(calls, 1);
    cr_assert_eq(later, 0, "callbacks after a give-up still ran");
}

#define NTHREADS 4

static void *alloc_thread(void *arg)
{
    void **out = arg;
    intptr_t rc = shim_device_malloc(dev, out, MB);
    return (void *)rc;
}

static void cb_wait_for_others(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    calls++;
    spyreshim_lock_release(lock);
    /* Bounded: the other threads must be parked on this event, not running
     * their own. */
    uint64_t waits = 0;
    for (int i = 0; i < 1000 && (waits = stats().pressure_waits) < NTHREADS - 1; i++)
        sleep_ms(10);
    cr_assert_eq(waits, NTHREADS - 1, "only %lu threads waited for the running event",
                 (unsigned long)waits);
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(shim_device_free(dev, blocks[--nblocks]), 0);
    spyreshim_lock_acquire(lock);
}

Test(pressure, concurrent_pressure_events_coalesce)
{
    fill(32 * MB);
    spyreshim_register_pressure_callback(cb_wait_for_others, NULL);
    pthread_t t[NTHREADS];
    void *ptrs[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, alloc_thread, &ptrs[i]), 0);
    for (int i = 0; i < NTHREADS; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        cr_assert_eq((intptr_t)rc, 0, "thread %d got error %ld", i, (long)(intptr_t)rc);
    }
    cr_assert_eq(calls, 1);
    cr_assert_eq(stats().pressure_events, 1);
}

#ifndef NDEBUG
static void cb_forgets_lock(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    spyreshim_lock_release(lock);
}

Test(pressure, debug_build_aborts_when_callback_keeps_lock_released, .signal = SIGABRT)
{
    fill(16 * MB);
    spyreshim_register_pressure_callback(cb_forgets_lock, NULL);
    void *p;
    shim_device_malloc(dev, &p, MB);
}
#endif

/* Waits bounded by progress (shim/alloc/progress.c), against a source
 * that says how much CPU the work used: the wait goes on while it used 1%
 * of a stretch, ends after a stretch without (stalled), and at the cap. */
static _Atomic uint64_t fake_cpu;
static uint64_t fake_progress(void) { return atomic_load(&fake_cpu); }

Test(pressure, a_wait_goes_on_while_the_work_uses_cpu_and_ends_when_it_stops)
{
    shim_progress_set_source(fake_progress);
    shim_progress_wait w;
    shim_progress_wait_begin(&w, 1000);
    struct timespec first = w.deadline;
    atomic_fetch_add(&fake_cpu, 10 * 1000000u);         /* 10 ms of 1000: progress */
    cr_assert(shim_progress_wait_extend(&w));
    cr_assert_eq(w.deadline.tv_sec, first.tv_sec + 1, "the deadline moved by one stretch");
    atomic_fetch_add(&fake_cpu, 9 * 1000000u);          /* under 1%: stalled */
    cr_assert_not(shim_progress_wait_extend(&w));
    cr_assert(w.stalled);

    shim_progress_wait_begin(&w, 10);                   /* 1 ms at least counts */
    atomic_fetch_add(&fake_cpu, 999999u);
    cr_assert_not(shim_progress_wait_extend(&w));

    shim_progress_wait_begin(&w, 10);
    unsigned stretches = 1;
    for (;;) {
        atomic_fetch_add(&fake_cpu, 5 * 1000000u);      /* spins forever */
        if (!shim_progress_wait_extend(&w))
            break;
        stretches++;
    }
    cr_assert_eq(stretches, SHIM_PROGRESS_CAP, "the cap bounds it");
    cr_assert_not(w.stalled);
    shim_progress_set_source(NULL);
}
