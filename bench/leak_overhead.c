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
 *   leak_overhead simdev DEPTH REPS THREADS [PAIRS]
 *                                     THREADS threads replay the trace at
 *                                     once, each with its own live set; only
 *                                     the first PAIRS pairs (for callgrind)
 *
 * Prints "path depth ns_per_pair" (best of REPS). A pair is one free and one
 * allocation; stacks are captured on the allocation only, so the difference
 * between two runs is the overhead per allocation. bench/leak_overhead.sh
 * runs the whole comparison. With THREADS it prints
 * "path depth threads T wall W cpu C": W the slowest thread's wall time per
 * pair, C its own CPU time per pair (CLOCK_THREAD_CPUTIME_ID: what the
 * allocating thread pays, less sensitive than W to a busy machine;
 * bench/trace_overhead.sh). Figures, not a test. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "simdev.h"
#include "trace.h"

static bool use_simdev;
static trace t;
static uint32_t npairs = PAIRS;

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

static double now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

struct run {
    void **live;
    double wall, cpu;   /* per pair; wall < 0: an allocation failed */
};

__attribute__((noinline)) static void replay(struct run *r)
{
    void **live = r->live;
    r->wall = -1;
    for (uint32_t i = 0; i < t.live; i++)
        if (!(live[i] = alloc(t.init[i])))
            return;
    double t0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t i = 0; i < npairs; i++) {
        uint32_t k = t.victim[i];
        release(live[k]);
        if (!(live[k] = alloc(t.size[i])))
            return;
    }
    r->cpu = (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / npairs;
    r->wall = (now_ns(CLOCK_MONOTONIC) - t0) / npairs;
    for (uint32_t i = 0; i < t.live; i++)
        release(live[i]);
}

/* Recursion that the compiler may neither flatten nor turn into a loop. */
__attribute__((noinline)) static void at_depth(int d, struct run *r)
{
    if (d <= 0) {
        replay(r);
        return;
    }
    volatile int keep = d;
    at_depth(keep - 1, r);
    __asm__ volatile("" ::: "memory");
}

static int recurse;

static void *thread_main(void *arg)
{
    at_depth(recurse, arg);
    return NULL;
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
    int threads = argc > 4 ? atoi(argv[4]) : 0;
    if (argc > 5 && atoi(argv[5]) > 0 && atoi(argv[5]) < PAIRS)
        npairs = (uint32_t)atoi(argv[5]);
    int nt = threads < 1 ? 1 : threads > 64 ? 64 : threads;
    /* main, replay and the libc start frames are below the recursion (a
     * thread has as many: start_thread, clone, thread_main). */
    recurse = depth > 4 ? depth - 4 : 0;
    make_trace(&t, false, TRACE_SEED_LOGUNIFORM);
    struct run runs[64];
    for (int i = 0; i < nt; i++)
        runs[i].live = malloc(t.live * sizeof(void *));
    double best = 0, best_cpu = 0;
    for (int r = 0; r < (reps < 1 ? 1 : reps); r++) {
        if (threads < 1) {
            at_depth(recurse, &runs[0]);
        } else {
            pthread_t th[64];
            for (int i = 0; i < nt; i++)
                pthread_create(&th[i], NULL, thread_main, &runs[i]);
            for (int i = 0; i < nt; i++)
                pthread_join(th[i], NULL);
        }
        double wall = 0, cpu = 0;
        for (int i = 0; i < nt; i++) {
            if (runs[i].wall < 0) {
                fprintf(stderr, "leak_overhead: allocation failed\n");
                return 1;
            }
            if (runs[i].wall > wall)
                wall = runs[i].wall;
            if (runs[i].cpu > cpu)
                cpu = runs[i].cpu;
        }
        if (r == 0 || wall < best)
            best = wall;
        if (r == 0 || cpu < best_cpu)
            best_cpu = cpu;
    }
    if (threads < 1)
        printf("%s %d %.1f\n", argv[1], depth, best);
    else
        printf("%s %d threads %d wall %.1f cpu %.1f\n", argv[1], depth, nt, best, best_cpu);
    return 0;
}
