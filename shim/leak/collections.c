/* What each collection run for a pressure event freed, by allocation site:
 * the "collections" section of the leak report (docs/report-format.md).
 *
 * The boundaries come from the watch this file registers with the pressure
 * event (shim_pressure_set_collection_watch; the collector calls it, the
 * allocator core knows neither side). At a collection's start the live
 * records are copied (stack ids only: spyreshim_snapshot_take, each arena
 * lock held for its copy); at its end only the sequence numbers of the
 * live allocations are (shim_device_live_seqs), and every block of the
 * first copy whose number is no longer among them was freed during the
 * collection: its size goes to its
 * site, (runtime, Python stack, native stack), the report's grouping key.
 * Nothing is added to the allocation or free path; the cost is the two
 * walks per collection, outside the collection's own time, in proportion
 * to the live blocks, measured per run (`cost_ns`, `cost_cpu_ns`).
 *
 * Owns the runs and the sites over the run, guarded by `coll_mu`, a leaf
 * taken for the merge of one collection's result only (no other lock, no
 * I/O, no Python under it; the fork policy takes it in prepare). The copy
 * of a collection in flight is the collecting thread's own (thread-local).
 * Only while leak checking is on. Never touches a Python object: names are
 * resolved at report time like every group's.
 */
#include "collections.h"

#include <inttypes.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "device.h"
#include "mutex.h"
#include "passthrough.h"
#include "pressure.h"
#include "report.h"
#include "spyreshim.h"
#include "units.h"

/* Runs kept in detail; later ones still count in the sites and totals. */
#define MAX_RUNS 1000

typedef struct site {
    const char *runtime;
    uint32_t native_stack, python_stack;
    uint64_t bytes, count, collections;
} site;

typedef struct run_site {
    uint32_t site;
    uint64_t bytes, count;
} run_site;

typedef struct run {
    uint64_t at_ns, ns, cost_ns, cost_cpu_ns, freed, attributed, blocks;
    long objects;
    run_site *sites;
    size_t nsites;
} run;

static pthread_mutex_t coll_mu = PTHREAD_MUTEX_INITIALIZER;
static site *g_sites;
static size_t g_nsites, g_capsites;
static run *g_runs;
static size_t g_nruns;
static uint64_t g_total_runs, g_freed, g_attributed, g_blocks, g_cost_ns, g_cost_cpu_ns;
static uint64_t g_start_ns;
static bool g_on;   /* set once by shim_collections_init (leak checking on) */

/* The collecting thread's copy at the start, and what that copy cost. */
static _Thread_local spyreshim_snapshot *tls_before;
static _Thread_local uint64_t tls_cost_ns, tls_cost_cpu_ns, tls_at_ns;

/* This thread's CPU time: the cost without the time a busy machine took
 * the CPU away (wall times are reported too). */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int key_cmp(const spyreshim_alloc_info *a, const spyreshim_alloc_info *b)
{
    if (a->runtime != b->runtime)
        return (uintptr_t)a->runtime < (uintptr_t)b->runtime ? -1 : 1;
    if (a->python_stack != b->python_stack)
        return a->python_stack < b->python_stack ? -1 : 1;
    if (a->native_stack != b->native_stack)
        return a->native_stack < b->native_stack ? -1 : 1;
    return 0;
}

static int info_cmp(const void *x, const void *y) { return key_cmp(x, y); }

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

/* The sequence numbers of every live allocation now, devices and memory
 * passed through; malloc'ed, NULL when out of host memory. */
static uint64_t *live_seqs(size_t *n)
{
    uint64_t *seqs = NULL;
    size_t cap = 0;
    *n = 0;
    for (size_t d = 0; d < shim_device_count(); d++) {
        shim_device *dev = shim_device_at(d);
        if (dev && shim_device_live_seqs(dev, &seqs, n, &cap) != 0) {
            free(seqs);
            return NULL;
        }
    }
    size_t k = 0;
    shim_pt_record *pt = shim_passthrough_live(0, &k);
    if (!pt && k) {
        free(seqs);
        return NULL;
    }
    if (k) {
        uint64_t *o = realloc(seqs, (*n + k) * sizeof *o);
        if (!o) {
            free(pt);
            free(seqs);
            return NULL;
        }
        seqs = o;
        for (size_t i = 0; i < k; i++)
            seqs[(*n)++] = pt[i].seq;
        free(pt);
    }
    return seqs ? seqs : malloc(sizeof *seqs);
}

/* The blocks of `before` whose sequence numbers `after` (na of them) no
 * longer has, into a malloc'ed array (*n set); NULL when out of host
 * memory. Sequence numbers are unique per allocation, so a freed block
 * whose address was reused meanwhile still counts as freed. */
static spyreshim_alloc_info *freed_blocks(const spyreshim_snapshot *before,
                                          const uint64_t *after, size_t na, size_t *n)
{
    size_t nb = spyreshim_snapshot_count(before);
    size_t cap = 16;
    while (cap < 2 * na)
        cap <<= 1;
    uint64_t *set = calloc(cap, sizeof *set);   /* seq + 1; 0 = empty */
    spyreshim_alloc_info *out = malloc((nb ? nb : 1) * sizeof *out);
    if (!set || !out) {
        free(set);
        free(out);
        return NULL;
    }
    for (size_t i = 0; i < na; i++) {
        uint64_t k = after[i] + 1;
        size_t h = (size_t)mix(k) & (cap - 1);
        while (set[h] && set[h] != k)
            h = (h + 1) & (cap - 1);
        set[h] = k;
    }
    *n = 0;
    for (size_t i = 0; i < nb; i++) {
        const spyreshim_alloc_info *a = spyreshim_snapshot_get(before, i);
        uint64_t k = a->seq + 1;
        size_t h = (size_t)mix(k) & (cap - 1);
        while (set[h] && set[h] != k)
            h = (h + 1) & (cap - 1);
        if (!set[h])
            out[(*n)++] = *a;
    }
    free(set);
    return out;
}

/* coll_mu held. The index of the site of `a` (appended when new), or
 * UINT32_MAX when out of host memory. */
static uint32_t site_of(const spyreshim_alloc_info *a)
{
    for (size_t i = 0; i < g_nsites; i++)
        if (g_sites[i].runtime == a->runtime && g_sites[i].native_stack == a->native_stack &&
            g_sites[i].python_stack == a->python_stack)
            return (uint32_t)i;
    if (g_nsites == g_capsites) {
        size_t cap = g_capsites ? 2 * g_capsites : 16;
        site *ns = realloc(g_sites, cap * sizeof *ns);
        if (!ns)
            return UINT32_MAX;
        g_sites = ns;
        g_capsites = cap;
    }
    g_sites[g_nsites] = (site){.runtime = a->runtime, .native_stack = a->native_stack,
                               .python_stack = a->python_stack};
    return (uint32_t)g_nsites++;
}

static void on_begin(void)
{
    if (tls_before)
        return;   /* a collection inside a collection's finalizer: the outer one counts */
    uint64_t t0 = shim_now_ns(), c0 = cpu_ns();
    tls_at_ns = t0;
    tls_before = spyreshim_snapshot_take(0);
    tls_cost_ns = shim_now_ns() - t0;
    tls_cost_cpu_ns = cpu_ns() - c0;
}

static void on_end(uint64_t ns, uint64_t freed, long objects)
{
    spyreshim_snapshot *before = tls_before;
    if (!before)
        return;
    tls_before = NULL;
    uint64_t t0 = shim_now_ns(), c0 = cpu_ns();
    size_t na = 0, n = 0;
    uint64_t *after = live_seqs(&na);
    spyreshim_alloc_info *gone = after ? freed_blocks(before, after, na, &n) : NULL;
    spyreshim_snapshot_free(before);
    free(after);
    if (!gone)
        return;   /* out of host memory: this collection is not recorded */
    qsort(gone, n, sizeof *gone, info_cmp);
    /* One entry per distinct site of this collection, in `gone` order. */
    run_site *rs = malloc((n ? n : 1) * sizeof *rs);
    if (!rs) {
        free(gone);
        return;
    }
    shim_mutex_lock(&coll_mu);
    size_t k = 0;
    uint64_t attributed = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        uint64_t bytes = 0;
        while (j < n && key_cmp(&gone[i], &gone[j]) == 0)
            bytes += gone[j++].size;
        uint32_t s = site_of(&gone[i]);
        if (s != UINT32_MAX) {
            g_sites[s].bytes += bytes;
            g_sites[s].count += j - i;
            g_sites[s].collections++;
            rs[k++] = (run_site){.site = s, .bytes = bytes, .count = j - i};
            attributed += bytes;
        }
        i = j;
    }
    uint64_t cost = tls_cost_ns + (shim_now_ns() - t0);
    uint64_t cost_cpu = tls_cost_cpu_ns + (cpu_ns() - c0);
    g_total_runs++;
    g_freed += freed;
    g_attributed += attributed;
    g_blocks += n;
    g_cost_ns += cost;
    g_cost_cpu_ns += cost_cpu;
    run *r = NULL;
    if (g_nruns < MAX_RUNS) {
        run *nr = realloc(g_runs, (g_nruns + 1) * sizeof *nr);
        if (nr) {
            g_runs = nr;
            r = &g_runs[g_nruns++];
        }
    }
    if (r) {
        *r = (run){.at_ns = tls_at_ns - g_start_ns, .ns = ns, .cost_ns = cost,
                   .cost_cpu_ns = cost_cpu, .freed = freed,
                   .attributed = attributed, .blocks = n, .objects = objects, .sites = rs,
                   .nsites = k};
        rs = NULL;
    }
    shim_mutex_unlock(&coll_mu);
    free(rs);
    free(gone);
}

static void watch(bool begin, uint64_t ns, uint64_t freed, long objects)
{
    if (begin)
        on_begin();
    else
        on_end(ns, freed, objects);
}

void shim_collections_init(void)
{
    g_on = true;
    g_start_ns = shim_now_ns();
    shim_pressure_set_collection_watch(watch);
}

static int site_cmp_bytes(const void *x, const void *y)
{
    const site *a = *(const site *const *)x, *b = *(const site *const *)y;
    if (a->bytes != b->bytes)
        return a->bytes > b->bytes ? -1 : 1;
    return a->count > b->count ? -1 : a->count < b->count;
}

char *shim_collections_json(void)
{
    if (!g_on)
        return NULL;
    /* A copy of the books, so that the report is built with no lock held. */
    shim_mutex_lock(&coll_mu);
    size_t ns = g_nsites, nr = g_nruns;
    uint64_t total = g_total_runs, freed = g_freed, attributed = g_attributed,
             blocks = g_blocks, cost = g_cost_ns, cost_cpu = g_cost_cpu_ns;
    site *sites = malloc((ns ? ns : 1) * sizeof *sites);
    run *runs = malloc((nr ? nr : 1) * sizeof *runs);
    size_t nrs = 0;
    for (size_t i = 0; i < nr; i++)
        nrs += g_runs[i].nsites;
    run_site *rsites = malloc((nrs ? nrs : 1) * sizeof *rsites);
    if (sites && runs && rsites) {
        memcpy(sites, g_sites, ns * sizeof *sites);
        size_t at = 0;
        for (size_t i = 0; i < nr; i++) {
            runs[i] = g_runs[i];
            memcpy(rsites + at, g_runs[i].sites, g_runs[i].nsites * sizeof *rsites);
            runs[i].sites = rsites + at;
            at += g_runs[i].nsites;
        }
    }
    shim_mutex_unlock(&coll_mu);
    char *text = NULL;
    size_t len = 0;
    site **order = sites ? malloc((ns ? ns : 1) * sizeof *order) : NULL;
    uint32_t *rank = sites ? malloc((ns ? ns : 1) * sizeof *rank) : NULL;
    spyreshim_alloc_info *infos = sites ? calloc(ns ? ns : 1, sizeof *infos) : NULL;
    shim_report *rep = NULL;
    FILE *f = NULL;
    if (!sites || !runs || !rsites || !order || !rank || !infos)
        goto out;
    /* "The cycles that held device memory": the sites, largest first. */
    for (size_t i = 0; i < ns; i++)
        order[i] = &sites[i];
    qsort(order, ns, sizeof *order, site_cmp_bytes);
    for (size_t i = 0; i < ns; i++) {
        rank[order[i] - sites] = (uint32_t)i;
        infos[i] = (spyreshim_alloc_info){.size = (size_t)order[i]->bytes,
                                          .native_stack = order[i]->native_stack,
                                          .python_stack = order[i]->python_stack,
                                          .runtime = order[i]->runtime};
    }
    /* One group per site (the key is the report's), for its frames. */
    rep = shim_report_build(infos, ns, NULL);
    f = rep ? open_memstream(&text, &len) : NULL;
    if (!f)
        goto out;
    fprintf(f, "{\n    \"count\": %" PRIu64 ",\n    \"freed\": %" PRIu64
               ",\n    \"attributed\": %" PRIu64 ",\n    \"blocks\": %" PRIu64
               ",\n    \"cost_ns\": %" PRIu64 ",\n    \"cost_cpu_ns\": %" PRIu64
               ",\n    \"runs_dropped\": %" PRIu64 ",\n    \"runs\": [",
            total, freed, attributed, blocks, cost, cost_cpu, total - nr);
    for (size_t i = 0; i < nr; i++) {
        const run *r = &runs[i];
        fprintf(f, "%s\n      {\"at_ns\": %" PRIu64 ", \"duration_ns\": %" PRIu64
                   ", \"cost_ns\": %" PRIu64 ", \"cost_cpu_ns\": %" PRIu64
                   ", \"objects\": %ld, \"freed\": %" PRIu64 ", \"attributed\": %" PRIu64
                   ", \"blocks\": %" PRIu64 ", \"sites\": [",
                i ? "," : "", r->at_ns, r->ns, r->cost_ns, r->cost_cpu_ns, r->objects,
                r->freed, r->attributed, r->blocks);
        for (size_t k = 0; k < r->nsites; k++)
            fprintf(f, "%s{\"site\": %" PRIu32 ", \"bytes\": %" PRIu64 ", \"count\": %" PRIu64 "}",
                    k ? ", " : "", rank[r->sites[k].site], r->sites[k].bytes,
                    r->sites[k].count);
        fputs("]}", f);
    }
    fprintf(f, "%s],\n    \"sites\": [", nr ? "\n    " : "");
    for (size_t i = 0; i < ns; i++) {
        const site *s = order[i];
        const shim_report_group *g = NULL;
        for (size_t j = 0; j < shim_report_ngroups(rep); j++) {
            const shim_report_group *c = shim_report_group_at(rep, j);
            if (c->runtime == s->runtime && c->native_stack == s->native_stack &&
                c->python_stack == s->python_stack) {
                g = c;
                break;
            }
        }
        fprintf(f, "%s\n      {\"bytes\": %" PRIu64 ", \"count\": %" PRIu64
                   ", \"collections\": %" PRIu64 ", ",
                i ? "," : "", s->bytes, s->count, s->collections);
        shim_report_json_site(f, g, s->runtime);
        fputc('}', f);
    }
    fprintf(f, "%s]\n  }", ns ? "\n    " : "");
    if (fclose(f) != 0) {
        free(text);
        text = NULL;
    }
out:
    shim_report_free(rep);
    free(infos);
    free(rank);
    free(order);
    free(rsites);
    free(runs);
    free(sites);
    return text;
}

bool shim_collections_top_site(char *out, size_t n)
{
    if (!g_on || n == 0)
        return false;
    site top = {0};
    shim_mutex_lock(&coll_mu);
    for (size_t i = 0; i < g_nsites; i++)
        if (g_sites[i].bytes > top.bytes)
            top = g_sites[i];
    shim_mutex_unlock(&coll_mu);
    if (!top.bytes)
        return false;
    spyreshim_alloc_info info = {.size = (size_t)top.bytes, .native_stack = top.native_stack,
                                 .python_stack = top.python_stack, .runtime = top.runtime};
    shim_report *rep = shim_report_build(&info, 1, NULL);
    const shim_report_group *g = rep && shim_report_ngroups(rep) ? shim_report_group_at(rep, 0)
                                                                : NULL;
    /* The innermost Python frame (where the program made the objects),
     * else the first named native one. */
    const shim_report_frame *f = NULL;
    for (size_t k = 0; g && k < g->nframes && !f; k++)
        if (g->frames[k].python)
            f = &g->frames[k];
    for (size_t k = 0; g && k < g->nframes && !f; k++)
        if (g->frames[k].function && !g->frames[k].folded)
            f = &g->frames[k];
    bool ok = f != NULL;
    char sz[SHIM_SIZE_TEXT];
    if (f)
        snprintf(out, n, "%s:%d in %s (%s freed by collections)",
                 f->file ? f->file : "?", f->line, f->function ? f->function : "?",
                 shim_size_text(sz, top.bytes));
    shim_report_free(rep);
    return ok;
}

void shim_collections_atfork_prepare(void) { shim_mutex_lock(&coll_mu); }
void shim_collections_atfork_parent(void) { shim_mutex_unlock(&coll_mu); }
void shim_collections_atfork_child(void)
{
    /* A collection in flight on another thread is not the child's. */
    shim_mutex_unlock(&coll_mu);
}
