/* What a failing simdevMalloc costs the thread that makes it (issue 7):
 * 10,000 live blocks (one call site, so one stack), the device filled up,
 * then requests that cannot be served. Prints the time of the first
 * failing call of this process and the median of the next ones, in
 * microseconds. Run under LD_PRELOAD=libspyreshim.so with
 * SPYRESHIM_LEAK_CHECK=1 and SPYRESHIM_GC=0 (no Python here); see
 * bench/oom_cost.sh. Figures, not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "simdev.h"

#define LIVE 10000
#define FAILS 51

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

__attribute__((noinline)) static int hold(void **p, size_t size)
{
    return simdevMalloc(p, size);
}

int main(void)
{
    static void *blocks[LIVE];
    for (int i = 0; i < LIVE; i++)
        if (hold(&blocks[i], 4096) != 0) {
            fprintf(stderr, "oom_cost: SIMDEV_MEMORY too small for %d blocks\n", LIVE);
            return 1;
        }
    void *p;
    while (hold(&p, 1 << 20) == 0)
        ;                                      /* fill the device */
    double t[FAILS];
    for (int i = 0; i < FAILS; i++) {
        double t0 = now_us();
        int rc = simdevMalloc(&p, (size_t)64 << 20);
        t[i] = now_us() - t0;
        if (rc == 0) {
            fprintf(stderr, "oom_cost: a request that should fail was served\n");
            return 1;
        }
    }
    double first = t[0];
    qsort(t + 1, FAILS - 1, sizeof t[0], cmp);
    printf("first %.1f us, median of the next %d %.1f us\n", first, FAILS - 1, t[FAILS / 2]);
    return 0;
}
