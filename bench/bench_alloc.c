/* Allocation benchmark: one trace, replayed through several allocators.
 *
 * The trace (fixed seed, bench/trace.h): N live blocks (10,000 unless told),
 * then 1,000,000 pairs "free a random live block, allocate a new one". Sizes
 * are log-uniform from 256 B to a maximum (4 MiB unless told) rounded up to
 * 256 B ("loguniform"), or drawn from 64 fixed sizes themselves drawn once
 * log-uniform ("sizes64", repeated tensor shapes). With T threads, each
 * replays a trace of its own with N/T live blocks and 1,000,000/T pairs,
 * against the same allocator; ns per pair is wall time over all pairs.
 * FILL says who allocates the live blocks before the pairs: "own" (each
 * thread its own: threads that allocate and free their own data) or
 * "main" (the main thread all of them, and the threads then free blocks
 * another thread allocated: a hand-off).
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
 *   bench_alloc PATH TRACE [reps] [live] [max_kib] [threads] [own|main]
 * BENCH_SEED=n in the environment replays another trace of the same shape.
 * Prints one line: path trace ns_per_pair peak_live peak_reserved frag
 * rss_per_live meta_per_live (reserved is known for core and for the
 * interposed path; 0 otherwise; frag for one thread only). rss_per_live is
 * the resident host memory gained from before the first allocation to the
 * end of the first repetition, per live block (the blocks are never
 * touched, so it is the allocator's own metadata); meta_per_live is the
 * shim's own accounting of its metadata (core only).
 * Nothing here touches the memory it gets. Figures, not a test. */
#include <dlfcn.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"
#include "arena_inspect.h"
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
    uint64_t (*meta_bytes)(void); /* the allocator's own accounting of its host metadata */
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
    core_table = core_arena ? shim_table_create(1024, (unsigned)__builtin_ctzll(be.alignment)) : NULL;
    return core_arena && core_table ? 0 : -1;
}
static void *core_alloc(size_t size)
{
    pthread_mutex_lock(&core_mu);
    uintptr_t addr;
    uint32_t node;
    size_t block_bytes;
    void *p = NULL;
    if (shim_arena_alloc(core_arena, size, &addr, &node, &block_bytes) == 0) {
        shim_live_fields f = shim_live_make(++core_seq, 0);
        if (shim_table_add(core_table, addr, node, &f) == 0)
            p = (void *)addr;
        else
            shim_arena_free_node(core_arena, node);
    }
    pthread_mutex_unlock(&core_mu);
    return p;
}
static uint64_t core_live_bytes;
static void core_free(void *p)
{
    shim_table_prefetch(core_table, (uintptr_t)p);
    pthread_mutex_lock(&core_mu);
    uint32_t node = shim_table_remove(core_table, (uintptr_t)p, NULL);
    if (node != SHIM_TABLE_NONE) {
        core_live_bytes -= shim_arena_block_requested(core_arena, node);
        shim_arena_free_node(core_arena, node);
    }
    pthread_mutex_unlock(&core_mu);
}
static uint64_t core_meta(void)
{
    return shim_arena_meta_bytes(core_arena) + shim_table_meta_bytes(core_table);
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
    { "core", core_init, core_alloc, core_free, core_peak, core_fini, core_meta },
    { "simdev", simdev_init, simdev_alloc, simdev_free, simdev_peak, NULL, NULL },
    { "jemalloc", je_init, je_alloc, je_release, NULL, NULL, NULL },
    { "glibc", no_init, libc_alloc, libc_free, NULL, NULL, NULL },
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%lu %lu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

/* One replayer: its own trace and live array. */
typedef struct worker {
    const path *p;
    trace t;
    void **live;
    pthread_barrier_t *start;
    bool fill;                  /* allocates its live blocks itself, before the start */
    int failed;
} worker;

static void *replay_pairs(void *arg)
{
    worker *w = arg;
    for (uint32_t i = 0; w->fill && i < w->t.live; i++)
        if (!(w->live[i] = w->p->alloc(w->t.init[i])))
            w->failed = 1;
    if (w->start)
        pthread_barrier_wait(w->start);
    if (w->failed)
        return NULL;
    for (uint32_t i = 0; i < w->t.pairs; i++) {
        uint32_t k = w->t.victim[i];
        w->p->free(w->live[k]);
        if (!(w->live[k] = w->p->alloc(w->t.size[i]))) {
            w->failed = 1;
            break;
        }
    }
    return NULL;
}

/* Replays the traces once, one thread per worker; returns ns per pair
 * (wall time over all pairs of all threads), or -1 on a failed alloc.
 * *rss_delta: resident bytes gained from before the first allocation to
 * the end of the pairs (the blocks are never touched, so this is the
 * allocator's own host memory). */
static double replay(worker *ws, int nthreads, bool own_fill, size_t *rss_delta)
{
    size_t rss0 = rss_bytes();
    uint64_t pairs = 0;
    for (int w = 0; w < nthreads; w++) {
        ws[w].fill = nthreads > 1 && own_fill; /* in its thread, before the clock starts */
        for (uint32_t i = 0; !ws[w].fill && i < ws[w].t.live; i++)
            if (!(ws[w].live[i] = ws[w].p->alloc(ws[w].t.init[i])))
                return -1;
        pairs += ws[w].t.pairs;
    }
    double t0, dt;
    if (nthreads == 1) {
        ws[0].start = NULL;
        t0 = now_ns();
        replay_pairs(&ws[0]);
        dt = now_ns() - t0;
    } else {
        pthread_barrier_t b;
        pthread_barrier_init(&b, NULL, (unsigned)nthreads + 1);
        pthread_t th[nthreads];
        for (int w = 0; w < nthreads; w++) {
            ws[w].start = &b;
            pthread_create(&th[w], NULL, replay_pairs, &ws[w]);
        }
        pthread_barrier_wait(&b);
        t0 = now_ns();
        for (int w = 0; w < nthreads; w++)
            pthread_join(th[w], NULL);
        dt = now_ns() - t0;
        pthread_barrier_destroy(&b);
    }
    *rss_delta = rss_bytes() - rss0;
    for (int w = 0; w < nthreads; w++) {
        if (ws[w].failed)
            return -1;
        for (uint32_t i = 0; i < ws[w].t.live; i++)
            ws[w].p->free(ws[w].live[i]);
    }
    return dt / (double)pairs;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s core|simdev|jemalloc|glibc loguniform|sizes64 "
                        "[reps] [live] [max_kib] [threads] [own|main]\n", argv[0]);
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
    uint32_t live = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : LIVE;
    double max = argc > 5 ? atof(argv[5]) * 1024 : MAX_SIZE;
    int nthreads = argc > 6 ? atoi(argv[6]) : 1;
    const char *fill = argc > 7 ? argv[7] : "own";
    bool own_fill = strcmp(fill, "own") == 0;
    if (live < 16 || max < MIN_SIZE || nthreads < 1 || nthreads > 16 ||
        (!own_fill && strcmp(fill, "main") != 0)) {
        fprintf(stderr, "bench: bad live, max_kib, threads or fill\n");
        return 2;
    }
    /* Several threads split the live set and the pairs; each replays a
     * trace of its own (seed + thread), against the same allocator. */
    worker ws[16];
    uint64_t seed = sizes64 ? TRACE_SEED_SIZES64 : TRACE_SEED_LOGUNIFORM;
    /* Another trace of the same shape: fragmentation is one draw of a
     * quantity that moves by a region at a time, and a mean over several
     * seeds says what a change does to it (bench/frag_seeds.sh). */
    const char *seed_env = getenv("BENCH_SEED");
    if (seed_env && *seed_env)
        seed += strtoull(seed_env, NULL, 10) * 1000003u;
    for (int w = 0; w < nthreads; w++) {
        ws[w] = (worker){ .p = p };
        make_trace_n(&ws[w].t, sizes64, seed + (uint64_t)w, live / (uint32_t)nthreads,
                     PAIRS / (uint32_t)nthreads, max);
        ws[w].live = malloc(ws[w].t.live * sizeof *ws[w].live);
        /* Touched now, so that the RSS delta is the allocator's alone.
         * Not memset(0): the compiler turns malloc + memset(0) into calloc,
         * whose fresh pages stay untouched until the replay, and the 8 bytes
         * a live block of this array then counted as the allocator's. */
        explicit_bzero(ws[w].live, ws[w].t.live * sizeof *ws[w].live);
    }
    if (p->init() != 0) {
        fprintf(stderr, "bench: %s unavailable\n", p->name);
        return 1;
    }
    double best = 0;
    size_t rss = 0;
    for (int r = 0; r < reps; r++) {
        size_t d = 0;
        double ns = replay(ws, nthreads, own_fill, &d);
        if (ns < 0) {
            fprintf(stderr, "bench: %s: allocation failed\n", p->name);
            return 1;
        }
        if (r == 0)
            rss = d; /* later repetitions reuse what the first one grew */
        if (r == 0 || ns < best)
            best = ns;
    }
    uint64_t peak = p->peak_reserved ? p->peak_reserved() : 0;
    uint64_t peak_live = nthreads == 1 ? ws[0].t.peak_live : 0;
    double meta = p->meta_bytes ? (double)p->meta_bytes() / live : 0;
    printf("%s %s %.1f %" PRIu64 " %" PRIu64 " %.4f %.1f %.1f\n", p->name, argv[2], best, peak_live,
           peak, peak && peak_live ? (double)peak / (double)peak_live : 0.0, (double)rss / live, meta);
    if (p->fini)
        p->fini();
    return 0;
}
