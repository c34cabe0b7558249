/* A library whose constructor allocates device memory: it runs under the
 * dynamic loader's lock (tests/programs/promises.c, "loader"). It tells
 * the program it is inside the constructor (promises_in_ctor, looked up in
 * the global scope), gives the program a moment to start its own first
 * allocation, then allocates and frees. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "simdev.h"

__attribute__((visibility("default"))) int ctor_alloc_result = -1;

__attribute__((constructor)) static void allocate_in_ctor(void)
{
    _Atomic int *flag = dlsym(RTLD_DEFAULT, "promises_in_ctor");
    if (flag)
        atomic_store(flag, 1);
    /* Widens the window in which the main thread enters its first
     * allocation while we hold the loader's lock; not a timing assertion. */
    struct timespec pause = {0, 5 * 1000 * 1000};
    nanosleep(&pause, NULL);
    void *p = NULL;
    ctor_alloc_result = simdevMalloc(&p, 1 << 20);
    if (ctor_alloc_result == 0)
        simdevFree(p);
}
