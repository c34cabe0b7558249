/* The target of bench/snapshot_pause.py: N live simdev blocks, and one
 * thread that allocates and frees a block in a loop and keeps the longest
 * time one pair took since the last "reset" (what an allocating thread of
 * the program sees while `spyreshim snapshot PID` copies the live records).
 *
 *   snapshot_target N      prints "ready PID"; then reads lines on stdin:
 *                          "reset" (answers "ok"), "max" (answers the
 *                          longest pair in ns since the reset), "quit".
 *
 * Run it under LD_PRELOAD=libspyreshim.so SPYRESHIM_CONTROL=1
 * SPYRESHIM_LEAK_CHECK=1. Figures, not a test. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "simdev.h"

static _Atomic uint64_t longest;
static atomic_bool stop;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *churn(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        uint64_t t0 = now_ns();
        void *p = NULL;
        if (simdevMalloc(&p, 512) == 0)
            simdevFree(p);
        uint64_t d = now_ns() - t0;
        uint64_t m = atomic_load(&longest);
        while (d > m && !atomic_compare_exchange_weak(&longest, &m, d))
            ;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 100000;
    void **blocks = calloc(n, sizeof *blocks);
    for (size_t i = 0; i < n; i++)
        if (simdevMalloc(&blocks[i], 256) != 0) {
            fprintf(stderr, "snapshot_target: allocation %zu failed\n", i);
            return 1;
        }
    pthread_t t;
    pthread_create(&t, NULL, churn, NULL);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "reset", 5) == 0) {
            atomic_store(&longest, 0);
            printf("ok\n");
        } else if (strncmp(line, "max", 3) == 0) {
            printf("%llu\n", (unsigned long long)atomic_load(&longest));
        } else {
            break;
        }
        fflush(stdout);
    }
    atomic_store(&stop, true);
    pthread_join(t, NULL);
    for (size_t i = 0; i < n; i++)
        simdevFree(blocks[i]);
    free(blocks);
    return 0;
}
