/* cuMemAlloc_v2 + cuMemFree_v2 pairs on the CUDA driver stand-in
 * (tests/cudadrv), run with and without the shim by bench/cuda_pair.sh.
 *
 *   cuda_pair PAIRS STREAMS
 *
 * 1,000 blocks stay live (256 B .. 1 MiB, log-uniform, fixed seed); each
 * pair frees a random live block and allocates a new one. With STREAMS > 0
 * the trace is free-heavy the way a training step is: before each free, a
 * small memset is queued on the block on one of STREAMS non-blocking
 * streams (round robin), so the free has work in flight on its block. The
 * driver's own cuMemFree waits for the device on every call; the shim's
 * keeps the block aside and waits once when it needs blocks back
 * (docs/cuda.md). Prints "pairs=N streams=S ns_per_pair=X".
 *
 *   cuda_pair PAIRS 0 async
 *
 * The same with cuMemAllocAsync + cuMemFreeAsync on one stream (the
 * driver's pools; the shim passes them through and records them):
 * bench/cuda_async_pair.sh counts its instructions under callgrind. */
#include <string.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cudadrv.h"

enum { LIVE_BLOCKS = 1000 };

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t size_of(uint64_t *s)
{
    double u = (double)(rng(s) >> 11) / 9007199254740992.0;
    double v = exp(log(256.0) + u * (log(1048576.0) - log(256.0)));
    return ((size_t)v + 255) & ~(size_t)255;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

#define CK(x)                                                          \
    do {                                                               \
        CUresult rc_ = (x);                                            \
        if (rc_ != CUDA_SUCCESS) {                                     \
            fprintf(stderr, "cuda_pair: %s failed: %d\n", #x, rc_);    \
            return 1;                                                  \
        }                                                              \
    } while (0)

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 200000;
    int nstreams = argc > 2 ? atoi(argv[2]) : 0;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(cuCtxSetCurrent(ctx));
    CUstream streams[8];
    if (nstreams > 8)
        nstreams = 8;
    for (int i = 0; i < nstreams; i++)
        CK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
    uint64_t seed = 0x5eed;
    CUdeviceptr live[LIVE_BLOCKS];
    if (argc > 3 && strcmp(argv[3], "async") == 0) {
        CUstream s;
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        for (int i = 0; i < LIVE_BLOCKS; i++)
            CK(cuMemAllocAsync(&live[i], size_of(&seed), s));
        double t0 = now();
        for (long p = 0; p < pairs; p++) {
            unsigned v = (unsigned)(rng(&seed) % LIVE_BLOCKS);
            CK(cuMemFreeAsync(live[v], s));
            CK(cuMemAllocAsync(&live[v], size_of(&seed), s));
        }
        double t1 = now();
        printf("pairs=%ld async ns_per_pair=%.0f\n", pairs, (t1 - t0) * 1e9 / pairs);
        for (int i = 0; i < LIVE_BLOCKS; i++)
            CK(cuMemFreeAsync(live[i], s));
        CK(cuStreamSynchronize(s));
        return 0;
    }
    for (int i = 0; i < LIVE_BLOCKS; i++)
        CK(cuMemAlloc_v2(&live[i], size_of(&seed)));
    double t0 = now();
    for (long p = 0; p < pairs; p++) {
        unsigned v = (unsigned)(rng(&seed) % LIVE_BLOCKS);
        if (nstreams)
            CK(cuMemsetD8Async(live[v], 1, 256, streams[p % nstreams]));
        CK(cuMemFree_v2(live[v]));
        CK(cuMemAlloc_v2(&live[v], size_of(&seed)));
    }
    double t1 = now();
    CK(cuCtxSynchronize());
    printf("pairs=%ld streams=%d ns_per_pair=%.0f\n", pairs, nstreams, (t1 - t0) * 1e9 / pairs);
    for (int i = 0; i < LIVE_BLOCKS; i++)
        CK(cuMemFree_v2(live[i]));
    return 0;
}
