/* The allocation trace shared by the benchmarks (bench_alloc.c,
 * leak_overhead.c): fixed seeds, so every path replays the same requests.
 * 10,000 live blocks, then 1,000,000 pairs "free a random live block,
 * allocate a new one"; sizes log-uniform from 256 B to 4 MiB rounded up to
 * 256 B ("loguniform"), or drawn from 64 fixed sizes themselves drawn once
 * log-uniform ("sizes64"). */
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

typedef struct trace {
    uint32_t init[LIVE];
    uint32_t *victim, *size;   /* PAIRS each */
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

static inline uint32_t log_uniform(uint64_t *s)
{
    double v = exp(log(MIN_SIZE) + rng_unit(s) * (log(MAX_SIZE) - log(MIN_SIZE)));
    uint64_t r = ((uint64_t)ceil(v) + 255) & ~(uint64_t)255;
    return (uint32_t)(r > MAX_SIZE ? MAX_SIZE : r);
}

static inline void make_trace(trace *t, bool sizes64, uint64_t seed)
{
    uint64_t s = seed;
    uint32_t table[NSIZES];
    for (int i = 0; i < NSIZES; i++)
        table[i] = log_uniform(&s);
#define DRAW() (sizes64 ? table[rng_next(&s) % NSIZES] : log_uniform(&s))
    t->victim = malloc(PAIRS * sizeof *t->victim);
    t->size = malloc(PAIRS * sizeof *t->size);
    uint64_t live = 0;
    for (int i = 0; i < LIVE; i++) {
        t->init[i] = DRAW();
        live += t->init[i];
    }
    t->peak_live = live;
    uint32_t *cur = malloc(LIVE * sizeof *cur);
    memcpy(cur, t->init, sizeof t->init);
    for (int i = 0; i < PAIRS; i++) {
        uint32_t k = (uint32_t)(rng_next(&s) % LIVE);
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

#endif
