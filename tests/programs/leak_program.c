/* A program that leaks simdev memory from known functions, for the leak
 * tests (run under LD_PRELOAD=libspyreshim.so SPYRESHIM_LEAK_CHECK=1).
 * Each argument is one step:
 *   small      leak_small_blocks(): 3 blocks of 1000 bytes
 *   big        leak_one_big(): 1 block of 1 MiB
 *   other      leak_in_other_function(): 2 blocks of 4096 bytes
 *   clean      allocate_and_free(): nothing left behind
 *   threads:N  N threads each run thread_leak(): 1 block of 512 bytes
 *   atexit     leak_at_exit(), registered with atexit: 1 block of 777 bytes
 *              allocated while the process exits
 * Prints "done" and returns 0; whatever else the exit status says comes
 * from the shim's leak verdict. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"

#define KEEP __attribute__((noinline, used))

static void *must_alloc(size_t n)
{
    void *p = NULL;
    if (simdevMalloc(&p, n) != simdevSuccess) {
        fprintf(stderr, "simdevMalloc(%zu) failed\n", n);
        exit(2);
    }
    return p;
}

/* The allocation sits in the named function itself (not in must_alloc) so
 * that its frame is the first native frame of the report. */
#define ALLOC(p, n)                                                    \
    do {                                                               \
        if (simdevMalloc(&(p), (n)) != simdevSuccess) {                \
            fprintf(stderr, "simdevMalloc(%zu) failed\n", (size_t)(n)); \
            exit(2);                                                   \
        }                                                              \
        __asm__ volatile("" ::: "memory");                             \
    } while (0)

/* One call site per function, so one group each (no unrolled copies). */
#if defined(__clang__)
#define NO_UNROLL _Pragma("clang loop unroll(disable)")
#else
#define NO_UNROLL _Pragma("GCC unroll 1")
#endif

KEEP void leak_small_blocks(void)
{
    NO_UNROLL
    for (int i = 0; i < 3; i++) {
        void *p;
        ALLOC(p, 1000);
    }
}

KEEP void leak_one_big(void)
{
    void *p;
    ALLOC(p, 1 << 20);
}

KEEP void leak_in_other_function(void)
{
    NO_UNROLL
    for (int i = 0; i < 2; i++) {
        void *p;
        ALLOC(p, 4096);
    }
}

KEEP void allocate_and_free(void)
{
    void *p = must_alloc(65536);
    simdevFree(p);
}

KEEP static void *thread_leak(void *arg)
{
    (void)arg;
    void *p;
    ALLOC(p, 512);
    return NULL;
}

KEEP static void leak_at_exit(void)
{
    void *p;
    ALLOC(p, 777);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "small")) {
            leak_small_blocks();
        } else if (!strcmp(a, "big")) {
            leak_one_big();
        } else if (!strcmp(a, "other")) {
            leak_in_other_function();
        } else if (!strcmp(a, "clean")) {
            allocate_and_free();
        } else if (!strcmp(a, "atexit")) {
            atexit(leak_at_exit);
        } else if (!strncmp(a, "threads:", 8)) {
            int n = atoi(a + 8);
            pthread_t th[64];
            if (n < 1 || n > 64)
                return 2;
            for (int t = 0; t < n; t++)
                if (pthread_create(&th[t], NULL, thread_leak, NULL) != 0)
                    return 2;
            for (int t = 0; t < n; t++)
                pthread_join(th[t], NULL);
        } else {
            fprintf(stderr, "unknown step %s\n", a);
            return 2;
        }
    }
    /* Also a direct reference to libsimdev (the shim does not wrap this
     * one), so the linked variant keeps libsimdev as a dependency. */
    printf("done (%s)\n", simdevGetErrorString(simdevSuccess));
    return 0;
}
