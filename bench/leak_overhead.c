/* Leak-checking overhead per allocation, native stacks: replays the shared
 * trace (trace.h, "loguniform") with every request made DEPTH frames below
 * main, so that a depth-32 capture really walks 32 frames.
 *
 *   leak_overhead simdev DEPTH REPS   simdevMalloc/simdevFree (run it under
 *                                     LD_PRELOAD=libspyreshim.so with
 *                                     SPYRESHIM_LEAK_CHECK=0 or 1)
 *   leak_overhead malloc DEPTH REPS   malloc/free (run it bare and under
 *                                     heaptrack: the anchor)
 *
 * Prints "path depth ns_per_pair" (best of REPS). A pair is one free and one
 * allocation; stacks are captured on the allocation only, so the difference
 * between two runs is the overhead per allocation. bench/leak_overhead.sh
 * runs the whole comparison. Figures, not a test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "simdev.h"
#include "trace.h"

static bool use_simdev;
static trace t;
static void **live;

static void *alloc(size_t n)
{
    if (use_simdev) {
        void *p = NULL;
        return simdevMalloc(&p, n) == 0 ? p : NULL;
    }
    return malloc(n);
}

static void release(void *p)
{
    if (use_simdev)
        simdevFree(p);
    else
        free(p);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

__attribute__((noinline)) static double replay(void)
{
    for (uint32_t i = 0; i < t.live; i++)
        if (!(live[i] = alloc(t.init[i])))
            return -1;
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
        uint32_t k = t.victim[i];
        release(live[k]);
        if (!(live[k] = alloc(t.size[i])))
            return -1;
    }
    double dt = now_ns() - t0;
    for (uint32_t i = 0; i < t.live; i++)
        release(live[i]);
    return dt / PAIRS;
}

/* Recursion that the compiler may neither flatten nor turn into a loop. */
__attribute__((noinline)) static double at_depth(int d)
{
    if (d <= 0)
        return replay();
    volatile int keep = d;
    double r = at_depth(keep - 1);
    __asm__ volatile("" ::: "memory");
    return r;
}

int main(int argc, char **argv)
{
    if (argc < 2 || (strcmp(argv[1], "simdev") && strcmp(argv[1], "malloc"))) {
        fprintf(stderr, "usage: %s simdev|malloc [depth] [reps]\n", argv[0]);
        return 2;
    }
    use_simdev = strcmp(argv[1], "simdev") == 0;
    int depth = argc > 2 ? atoi(argv[2]) : 32;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    /* main, replay and the libc start frames are below the recursion. */
    int recurse = depth > 4 ? depth - 4 : 0;
    make_trace(&t, false, TRACE_SEED_LOGUNIFORM);
    live = malloc(t.live * sizeof *live);
    double best = 0;
    for (int r = 0; r < (reps < 1 ? 1 : reps); r++) {
        double ns = at_depth(recurse);
        if (ns < 0) {
            fprintf(stderr, "leak_overhead: allocation failed\n");
            return 1;
        }
        if (r == 0 || ns < best)
            best = ns;
    }
    printf("%s %d %.1f\n", argv[1], depth, best);
    return 0;
}
