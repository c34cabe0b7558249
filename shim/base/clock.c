/* Deadlines and condition variables on the monotonic clock (clock.h).
 *
 * Owns no state and takes no lock. Must never use CLOCK_REALTIME: a bound
 * of two seconds must stay two seconds when the wall clock is set. */
#include "clock.h"

#define NS_PER_S 1000000000L

uint64_t shim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * (uint64_t)NS_PER_S + (uint64_t)ts.tv_nsec;
}

void shim_deadline_after_ms(struct timespec *deadline, unsigned ms)
{
    clock_gettime(CLOCK_MONOTONIC, deadline);
    deadline->tv_sec += ms / 1000;
    deadline->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (deadline->tv_nsec >= NS_PER_S) {
        deadline->tv_sec++;
        deadline->tv_nsec -= NS_PER_S;
    }
}

void shim_cond_init_monotonic(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
}
