/* An embedding program, as the design notes describe embedders: it
 * dlopen()s libpython with RTLD_LOCAL (so dlsym(RTLD_DEFAULT) finds no Py*
 * symbol), runs many Py_Initialize/Py_Finalize cycles, and keeps a C thread
 * allocating device memory before, during and after each finalization.
 *
 *   embed_cycles LIBPYTHON GLUE_LIB CYCLES
 *
 * GLUE_LIB is a library that depends on both libpython and the simdev
 * module, opened RTLD_LOCAL too: an extension module does not link libpython,
 * so with a local libpython `import simdev` could not resolve its Py*
 * symbols by itself (PYTHONPATH must point at the module's directory).
 *
 * In every cycle, Python fills the device with garbage (reference cycles
 * holding tensors, collector disabled) and then needs more memory: that
 * only works if the shim collected. With the shim preloaded, each cycle
 * must add collections to the shim's statistics. Exits 0 on success, 1 with
 * a message otherwise. The C thread's requests may fail while Python is
 * down (nothing can be collected then); they must never crash or hang. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "simdev.h"
#include "spyreshim.h"

static _Atomic int stop;
static _Atomic long c_ok, c_oom;

static void *c_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        void *p = NULL;
        int err = simdevMalloc(&p, 1 << 20);
        if (err == simdevSuccess) {
            atomic_fetch_add(&c_ok, 1);
            simdevMemset(p, 0x33, 1 << 20);
            simdevFree(p);
        } else {
            atomic_fetch_add(&c_oom, 1);
        }
        struct timespec ts = {0, 300000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static const char *script =
    "import gc, simdev\n"
    "gc.disable()\n"
    "def garbage(n):\n"
    "    for i in range(n):\n"
    "        t = simdev.Tensor(1 << 20); t.me = t; del t\n"
    "while simdev.mem_info()[0] >= 1 << 20:\n"
    "    garbage(1)\n"
    /* For a while, keep every free byte taken by garbage, yielding the GIL
     * often: the C thread, which frees and re-allocates 1 MiB, meets a full
     * device and must be served by the shim's thread while Python runs. */
    "import time\n"
    "end = time.monotonic() + 0.1\n"
    "while time.monotonic() < end:\n"
    "    if simdev.mem_info()[0] >= 1 << 18:\n"
    "        t = simdev.Tensor(1 << 18); t.me = t; del t\n"
    "    else:\n"
    "        time.sleep(0.0002)\n"
    "while simdev.mem_info()[0] >= 1 << 20:\n"
    "    garbage(1)\n"
    "garbage(40)\n"          /* needs collections: the device is full of garbage */
    "live = [simdev.Tensor(1 << 20) for i in range(4)]\n"
    "for i, t in enumerate(live): t.fill(i)\n"
    "garbage(20)\n"
    "assert [t.read()[:1] for t in live] == [bytes([i]) for i in range(4)]\n"
    "del live\n"
    "while simdev.mem_info()[0] >= 1 << 20:\n"  /* finalization starts with a full device */
    "    garbage(1)\n";

#define SYM(h, name, type) ((type)dlsym(h, name))

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s LIBPYTHON GLUE_LIB CYCLES\n", argv[0]);
        return 2;
    }
    int cycles = atoi(argv[3]);
    void *py = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!py) {
        fprintf(stderr, "embed_cycles: %s\n", dlerror());
        return 1;
    }
    if (!dlopen(argv[2], RTLD_NOW | RTLD_LOCAL)) {
        fprintf(stderr, "embed_cycles: %s\n", dlerror());
        return 1;
    }
    if (dlsym(RTLD_DEFAULT, "Py_IsInitialized")) {
        fprintf(stderr, "embed_cycles: libpython is global; the test needs it local\n");
        return 1;
    }
    void (*initialize)(int) = SYM(py, "Py_InitializeEx", void (*)(int));
    int (*finalize)(void) = SYM(py, "Py_FinalizeEx", int (*)(void));
    int (*run)(const char *) = SYM(py, "PyRun_SimpleString", int (*)(const char *));
    int (*(get_stats))(spyreshim_stats *) =
        SYM(RTLD_DEFAULT, "spyreshim_get_stats", int (*)(spyreshim_stats *));
    if (!initialize || !finalize || !run) {
        fprintf(stderr, "embed_cycles: libpython lacks the embedding API\n");
        return 1;
    }

    pthread_t t;
    pthread_create(&t, NULL, c_thread, NULL);
    struct timespec pause = {0, 20000000};
    int rc = 0;
    for (int c = 0; c < cycles && rc == 0; c++) {
        nanosleep(&pause, NULL);                /* the C thread runs before Python */
        spyreshim_stats before = {.size = sizeof before}, after = {.size = sizeof after};
        if (get_stats)
            get_stats(&before);
        initialize(0);
        if (run(script) != 0) {
            fprintf(stderr, "embed_cycles: cycle %d: the script failed\n", c);
            rc = 1;
        }
        if (get_stats) {
            get_stats(&after);
            if (after.gc_collections == before.gc_collections) {
                fprintf(stderr, "embed_cycles: cycle %d: no collection served Python\n", c);
                rc = 1;
            }
        }
        if (finalize() != 0)
            fprintf(stderr, "embed_cycles: cycle %d: Py_FinalizeEx reported an error\n", c);
        /* After finalization: a full device while no Python exists. */
        void *held[4096];
        int nheld = 0;
        while (nheld < 4096 && simdevMalloc(&held[nheld], 1 << 20) == simdevSuccess)
            nheld++;
        nanosleep(&pause, NULL);
        while (nheld > 0)
            simdevFree(held[--nheld]);
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("embed_cycles: %d cycles, C thread: %ld ok, %ld out of memory, shim %s\n", cycles,
           atomic_load(&c_ok), atomic_load(&c_oom), get_stats ? "present" : "absent");
    return rc;
}
