/* Bounded waits on the monotonic clock (shim/base/clock.c). Nothing is
 * timed: the deadline is compared with the clock read around it, and the
 * wait on a past deadline must return ETIMEDOUT at once. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>

#include "clock.h"

static int64_t ns(const struct timespec *t)
{
    return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

Test(clock, deadline_is_now_plus_the_bound_on_the_monotonic_clock)
{
    static const unsigned bounds[] = {0, 1, 999, 1000, 1001, 1999, 2000, 3600000};
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++) {
        struct timespec before, d, after;
        clock_gettime(CLOCK_MONOTONIC, &before);
        shim_deadline_after_ms(&d, bounds[i]);
        clock_gettime(CLOCK_MONOTONIC, &after);
        cr_assert(d.tv_nsec >= 0 && d.tv_nsec < 1000000000, "normalized (%u ms)", bounds[i]);
        int64_t add = (int64_t)bounds[i] * 1000000;
        cr_assert_geq(ns(&d), ns(&before) + add, "%u ms", bounds[i]);
        cr_assert_leq(ns(&d), ns(&after) + add, "%u ms", bounds[i]);
    }
}

Test(clock, a_monotonic_condition_variable_waits_until_its_deadline)
{
    /* ETIMEDOUT means the deadline passed on the condition variable's own
     * clock. Made with the wrong clock (CLOCK_REALTIME, where a monotonic
     * reading is a moment in 1970), the wait would return at once, before
     * the monotonic deadline. */
    pthread_cond_t cv;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    shim_cond_init_monotonic(&cv);
    struct timespec d, now;
    shim_deadline_after_ms(&d, 20);
    pthread_mutex_lock(&mu);
    int rc;
    while ((rc = pthread_cond_timedwait(&cv, &mu, &d)) == 0)
        ; /* spurious wake-up */
    pthread_mutex_unlock(&mu);
    clock_gettime(CLOCK_MONOTONIC, &now);
    cr_assert_eq(rc, ETIMEDOUT);
    cr_assert_geq(ns(&now), ns(&d), "returned before its deadline: not the monotonic clock");
    pthread_cond_destroy(&cv);
}
