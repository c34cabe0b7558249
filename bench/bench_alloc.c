/* Allocation benchmark: one trace, replayed through several allocators.
 *
 * The trace (fixed seed): 10,000 live blocks, then 1,000,000 pairs "free a
 * random live block, allocate a new one". Sizes are log-uniform from 256 B
 * to 4 MiB rounded up to 256 B ("loguniform"), or drawn from 64 fixed sizes
 * themselves drawn once log-uniform ("sizes64", repeated tensor shapes).
 *
 * Paths:
 *   core      shim_arena + shim_table exactly as device.c uses them (an
 *             uncontended pthread mutex around each call, a record per
 *             block), over a fake backend that hands out address space;
 *   simdev    simdevMalloc/simdevFree: with LD_PRELOAD=libspyreshim.so this
 *             is the whole interposed path, without it the bare simulator;
 *   jemalloc  malloc/free of Debian's libjemalloc.so.2 through dlopen;
 *   glibc     the C library's malloc/free, for information.
 *
 * Prints one line: path trace ns_per_pair peak_live peak_reserved frag
 * (reserved is known for core and for the interposed path; 0 otherwise).
 * Nothing here touches the memory it gets. Figures, not a test. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "table.h"
#include "simdev.h"
#include "spyreshim.h"

#include "trace.h"

/* ---- the paths ----------------------------------------------------- */

typedef struct path {
    const char *name;
    int (*init)(void);
    void *(*alloc)(size_t);
    void (*free)(void *);
    uint64_t (*peak_reserved)(void);
    void (*fini)(void);
} path;

/* core: a fake backend handing out address space, never touched */
static uintptr_t fake_next = (uintptr_t)1 << 44;
static int fake_reserve(void *ctx, size_t size, uintptr_t *addr)
{
    (void)ctx;
    *addr = fake_next;
    fake_next += (size + ((uintptr_t)1 << 21) - 1) & ~(((uintptr_t)1 << 21) - 1);
    return 0;
}
static void fake_release(void *ctx, uintptr_t addr, size_t size)
{
    (void)ctx, (void)addr, (void)size;
}
static int fake_mem_info(void *ctx, size_t *fr, size_t *total)
{
    (void)ctx;
    *total = (size_t)64 << 30;
    *fr = *total;
    return 0;
}

static shim_arena *core_arena;
static shim_table *core_table;
static pthread_mutex_t core_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t core_seq;

static int core_init(void)
{
    static const shim_region_backend be = { .reserve = fake_reserve, .release = fake_release,
                                            .mem_info = fake_mem_info, .alignment = 256 };
    core_arena = shim_arena_create(&be, 0, 0);
    core_table = shim_table_create(1024);
    return core_arena && core_table ? 0 : -1;
}
static void *core_alloc(size_t size)
{
    pthread_mutex_lock(&core_mu);
    uintptr_t addr;
    uint32_t node;
    size_t taken;
    void *p = NULL;
    if (shim_arena_alloc(core_arena, size, &addr, &node, &taken) == 0) {
        shim_record r = { .ptr = addr, .size = size, .seq = ++core_seq, .node = node };
        if (shim_table_insert(core_table, &r) == 0)
            p = (void *)addr;
        else
            shim_arena_free_node(core_arena, node);
    }
    pthread_mutex_unlock(&core_mu);
    return p;
}
static void core_free(void *p)
{
    pthread_mutex_lock(&core_mu);
    shim_record r;
    if (shim_table_remove(core_table, (uintptr_t)p, &r))
        shim_arena_free_node(core_arena, r.node);
    pthread_mutex_unlock(&core_mu);
}
static uint64_t core_peak(void)
{
    shim_arena_counters c;
    shim_arena_get_counters(core_arena, &c);
    return c.peak_reserved_bytes;
}
static void core_fini(void)
{
    shim_arena_destroy(core_arena);
    shim_table_destroy(core_table);
}

/* simdev, interposed or not */
static int (*get_stats)(spyreshim_stats *);
static int simdev_init(void)
{
    get_stats = (int (*)(spyreshim_stats *))dlsym(RTLD_DEFAULT, "spyreshim_get_stats");
    if (!get_stats)
        fprintf(stderr, "bench: libspyreshim is not preloaded: measuring the bare simulator\n");
    return 0;
}
static void *simdev_alloc(size_t size)
{
    void *p = NULL;
    return simdevMalloc(&p, size) == 0 ? p : NULL;
}
static void simdev_free(void *p)
{
    simdevFree(p);
}
static uint64_t simdev_peak(void)
{
    spyreshim_stats st = { .size = sizeof st };
    return get_stats && get_stats(&st) == 0 ? st.peak_reserved_bytes : 0;
}

/* jemalloc through its own handle */
static void *(*je_malloc)(size_t);
static void (*je_free)(void *);
static char **main_argv;
static int je_init(void)
{
    void *h = dlopen("libjemalloc.so.2", RTLD_NOW | RTLD_LOCAL);
    /* Debian's jemalloc uses initial-exec TLS, which a dlopen can only get
     * from the loader's spare static TLS: ask for more and start again. */
    if (!h && !getenv("GLIBC_TUNABLES")) {
        setenv("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=16384", 1);
        execv("/proc/self/exe", main_argv);
    }
    if (!h) {
        fprintf(stderr, "bench: %s\n", dlerror());
        return -1;
    }
    je_malloc = (void *(*)(size_t))dlsym(h, "malloc");
    je_free = (void (*)(void *))dlsym(h, "free");
    return je_malloc && je_free ? 0 : -1;
}
static void *je_alloc(size_t n)
{
    return je_malloc(n);
}
static void je_release(void *p)
{
    je_free(p);
}

static int no_init(void)
{
    return 0;
}
static void *libc_alloc(size_t n)
{
    return malloc(n);
}
static void libc_free(void *p)
{
    free(p);
}

static const path paths[] = {
    { "core", core_init, core_alloc, core_free, core_peak, core_fini },
    { "simdev", simdev_init, simdev_alloc, simdev_free, simdev_peak, NULL },
    { "jemalloc", je_init, je_alloc, je_release, NULL, NULL },
    { "glibc", no_init, libc_alloc, libc_free, NULL, NULL },
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Replays the trace once; returns ns per pair, or -1 on a failed alloc. */
static double replay(const path *p, const trace *t, void **live)
{
    for (int i = 0; i < LIVE; i++)
        if (!(live[i] = p->alloc(t->init[i])))
            return -1;
    double t0 = now_ns();
    for (int i = 0; i < PAIRS; i++) {
        uint32_t k = t->victim[i];
        p->free(live[k]);
        if (!(live[k] = p->alloc(t->size[i])))
            return -1;
    }
    double dt = now_ns() - t0;
    for (int i = 0; i < LIVE; i++)
        p->free(live[i]);
    return dt / PAIRS;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s core|simdev|jemalloc|glibc loguniform|sizes64 [reps]\n", argv[0]);
        return 2;
    }
    const path *p = NULL;
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (strcmp(paths[i].name, argv[1]) == 0)
            p = &paths[i];
    bool sizes64 = strcmp(argv[2], "sizes64") == 0;
    if (!p || (!sizes64 && strcmp(argv[2], "loguniform") != 0)) {
        fprintf(stderr, "bench: unknown path or trace\n");
        return 2;
    }
    main_argv = argv;
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (reps < 1)
        reps = 1;
    static trace t;
    make_trace(&t, sizes64, sizes64 ? TRACE_SEED_SIZES64 : TRACE_SEED_LOGUNIFORM);
    if (p->init() != 0) {
        fprintf(stderr, "bench: %s unavailable\n", p->name);
        return 1;
    }
    void **live = malloc(LIVE * sizeof *live);
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double ns = replay(p, &t, live);
        if (ns < 0) {
            fprintf(stderr, "bench: %s: allocation failed\n", p->name);
            return 1;
        }
        if (r == 0 || ns < best)
            best = ns;
    }
    uint64_t peak = p->peak_reserved ? p->peak_reserved() : 0;
    printf("%s %s %.1f %" PRIu64 " %" PRIu64 " %.4f\n", p->name, argv[2], best, t.peak_live, peak,
           peak ? (double)peak / (double)t.peak_live : 0.0);
    if (p->fini)
        p->fini();
    free(live);
    return 0;
}
