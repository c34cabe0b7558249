/* Capacity: a sequence of allocations that fits the device exactly and
 * fragments a suballocator's regions, for tests/integration/test_capacity.py
 * to run with and without the shim and compare: the shim must serve every
 * request the device alone serves (and refuse the same ones).
 *
 * Built twice from this file: for the simulated device (simdevMalloc) and,
 * with -DCAPACITY_CUDA, for the CUDA driver (cuMemAlloc_v2; the stand-in
 * in tests/cudadrv). The sizes are those of pytorch/examples' mnist on the
 * device (issue 44): 4.5 MiB (fc1's weight, its gradient, its optimizer
 * state) and 14,745,600 bytes (conv2's output of a batch of 100).
 *
 * Prints one line per phase, a character per request ('+' served, '-'
 * refused), then "capacity ok"; exits 0, or 2 when the device call itself
 * misbehaves (a free refused). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CAPACITY_CUDA
#include "cudadrv.h"
typedef CUdeviceptr dptr;
static int dev_alloc(dptr *p, size_t n) { return cuMemAlloc_v2(p, n) != CUDA_SUCCESS; }
static int dev_free(dptr p) { return cuMemFree_v2(p) != CUDA_SUCCESS; }
#else
#include "simdev.h"
typedef void *dptr;
static int dev_alloc(dptr *p, size_t n) { return simdevMalloc(p, n) != simdevSuccess; }
static int dev_free(dptr p) { return simdevFree(p) != simdevSuccess; }
#endif

#define A ((size_t)4718592)
#define B ((size_t)14745600)
#define MAXB 64

static dptr kept[MAXB];
static size_t nkept;
static char line[256];
static size_t nline;

static void must_free(dptr p)
{
    if (dev_free(p)) {
        fprintf(stderr, "capacity: a free was refused\n");
        exit(2);
    }
}

static void mark(bool ok)
{
    if (nline + 1 < sizeof line)
        line[nline++] = ok ? '+' : '-';
}

/* One request: recorded in the phase's line; kept when `keep`. */
static bool request(size_t size, bool keep)
{
    dptr p;
    bool ok = !dev_alloc(&p, size);
    mark(ok);
    if (ok && keep && nkept < MAXB)
        kept[nkept++] = p;
    else if (ok)
        must_free(p);
    return ok;
}

static void phase(const char *name)
{
    line[nline] = 0;
    printf("%s %s\n", name, line);
    nline = 0;
}

int main(void)
{
#ifdef CAPACITY_CUDA
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "capacity: no CUDA device\n");
        return 2;
    }
#endif
    /* A large block, freed, then a smaller one kept, until the smaller
     * ones fill the device: each freed large block's place goes to the
     * small ones, on the device alone. */
    for (int k = 0; k < MAXB; k++) {
        request(B, false);
        if (!request(A, true))
            break;
    }
    phase("freed-large-then-small");
    /* Every other small block freed: holes of 4.5 MiB, none for a large
     * block; the small ones fill them again. */
    for (size_t i = 0; i < nkept; i += 2) {
        must_free(kept[i]);
        kept[i] = kept[--nkept];
    }
    request(B, false);
    while (request(A, true))
        ;
    phase("every-other-freed");
    while (nkept)
        must_free(kept[--nkept]);
    /* Interleaved, until neither fits; every large one freed; then small
     * ones, then large ones, until each is refused. */
    dptr big[MAXB];
    size_t nbig = 0;
    for (int k = 0; k < MAXB; k++) {
        bool a = request(A, true);
        dptr p;
        bool b = nbig < MAXB && !dev_alloc(&p, B);
        mark(b);
        if (b)
            big[nbig++] = p;
        if (!a && !b)
            break;
    }
    while (nbig)
        must_free(big[--nbig]);
    while (request(A, true))
        ;
    while (request(B, true))
        ;
    phase("interleaved");
    while (nkept)
        must_free(kept[--nkept]);
    printf("capacity ok\n");
    return 0;
}
