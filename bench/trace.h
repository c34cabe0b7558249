/* The allocation traces shared by the benchmarks (bench_alloc.c,
 * leak_overhead.c): fixed seeds, so every path replays the same requests.
 * `live` blocks, then PAIRS pairs "free a random live block, allocate a new
 * one"; sizes log-uniform from 256 B to `max_size` rounded up to 256 B
 * ("loguniform"), or drawn from 64 fixed sizes themselves drawn once
 * log-uniform ("sizes64").
 *
 * The classic trace (bench/run.sh's first table, leak_overhead.c): 10,000
 * live blocks of 256 B .. 4 MiB. The live-set axis: 1k .. 1M live blocks of
 * 256 B .. 64 KiB (1M blocks of up to 4 MiB would be terabytes of simulated
 * device; at 64 KiB the peak is about 12 GiB). */
#ifndef BENCH_TRACE_H
#define BENCH_TRACE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_SEED_LOGUNIFORM 0x1057a11c
#define TRACE_SEED_SIZES64 0x64515e5

enum { LIVE = 10000, PAIRS = 1000000, NSIZES = 64 };
#define MIN_SIZE 256.0
#define MAX_SIZE (4.0 * 1024 * 1024)
#define SCALE_MAX_SIZE (64.0 * 1024)

typedef struct trace {
    uint32_t live, pairs;
    uint32_t *init;            /* live */
    uint32_t *victim, *size;   /* pairs each */
    uint64_t peak_live;
} trace;

static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * (1.0 / 9007199254740992.0);
}

static inline uint32_t log_uniform(uint64_t *s, double max)
{
    double v = exp(log(MIN_SIZE) + rng_unit(s) * (log(max) - log(MIN_SIZE)));
    uint64_t r = ((uint64_t)ceil(v) + 255) & ~(uint64_t)255;
    return (uint32_t)(r > max ? max : r);
}

/* With live = LIVE, pairs = PAIRS and max = MAX_SIZE this is, request for
 * request, the trace of the earlier single-size benchmark. */
static inline void make_trace_n(trace *t, bool sizes64, uint64_t seed, uint32_t live_n,
                                uint32_t pairs, double max)
{
    uint64_t s = seed;
    uint32_t table[NSIZES];
    for (int i = 0; i < NSIZES; i++)
        table[i] = log_uniform(&s, max);
#define DRAW() (sizes64 ? table[rng_next(&s) % NSIZES] : log_uniform(&s, max))
    t->live = live_n;
    t->pairs = pairs;
    t->init = malloc((size_t)live_n * sizeof *t->init);
    t->victim = malloc((size_t)pairs * sizeof *t->victim);
    t->size = malloc((size_t)pairs * sizeof *t->size);
    uint64_t live = 0;
    for (uint32_t i = 0; i < live_n; i++) {
        t->init[i] = DRAW();
        live += t->init[i];
    }
    t->peak_live = live;
    uint32_t *cur = malloc((size_t)live_n * sizeof *cur);
    memcpy(cur, t->init, (size_t)live_n * sizeof *cur);
    for (uint32_t i = 0; i < pairs; i++) {
        uint32_t k = (uint32_t)(rng_next(&s) % live_n);
        t->victim[i] = k;
        t->size[i] = DRAW();
        live += (uint64_t)t->size[i] - cur[k];
        cur[k] = t->size[i];
        if (live > t->peak_live)
            t->peak_live = live;
    }
#undef DRAW
    free(cur);
}

static inline void make_trace(trace *t, bool sizes64, uint64_t seed)
{
    make_trace_n(t, sizes64, seed, LIVE, PAIRS, MAX_SIZE);
}

#endif
