/* The random model test of every CUDA allocation family (issue 21's
 * Tests), run under LD_PRELOAD=libspyreshim.so on the stand-in driver by
 * tests/integration/test_cuda_async.py:
 *
 *   cuda_model SEED OPS LIMIT HOST_LIMIT
 *
 * OPS random operations, drawn from SEED (a fixed sequence: no timing
 * decides anything), over two devices: served cuMemAlloc_v2/cuMemFree_v2,
 * stream-ordered cuMemAllocAsync/cuMemAllocFromPoolAsync/cuMemFreeAsync on
 * three streams (a free on another stream than the allocation's too),
 * managed cuMemAllocManaged/cuMemFree_v2, host-pinned
 * cuMemHostAlloc/cuMemFreeHost, VMM physical cuMemCreate/cuMemRelease
 * (2 MiB each), pool trims, synchronizations, and stream
 * captures (global or thread-local mode) begun and ended in between,
 * against a model of the live bytes of each family on each device. After
 * every operation:
 *   - no limit escape: what the program holds of the device families on a
 *     device (served, async, managed) stays under LIMIT, host-pinned under
 *     HOST_LIMIT (a request the shim let through past them is an escape);
 *   - no accounting drift: the shim's statistics (spyreshim_get_stats:
 *     used_bytes, async_bytes, managed_bytes, host_pinned_bytes and the
 *     allocation and free counts) equal the model's;
 * and at the end no synchronizing call was made while a capture was live
 * (the stand-in counts them: cudastandinSyncsDuringCapture). Every answer
 * is one the driver may give: a capture makes regions, managed and pinned
 * requests fail with 900 or out-of-memory, never with anything else.
 *
 * It ends by printing "model <family> <device> <allocs> <frees>" per
 * family and device, for the test to compare with the statistics file.
 *
 * A family is a row of FAMILIES: its allocation and free through the
 * driver, and its statistics fields in check_stats (IPC would be one more
 * row and two functions). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"

/* The shim's statistics: the public header's struct, the fields read here
 * looked up by name in the field list (shim/include/spyreshim.h). */
#include "spyreshim.h"

#define NDEV 2
#define NSTREAMS 3
#define MAXLIVE 4096

/* ---- the random sequence (xorshift64*: fixed by the seed) ---------------- */
static uint64_t rng;
static uint64_t next_random(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}
static unsigned below(unsigned n)
{
    return (unsigned)(next_random() % n);
}

/* ---- state ---------------------------------------------------------------- */
static CUcontext ctx[NDEV];
static CUstream streams[NDEV][NSTREAMS];
static CUmemoryPool pools[NDEV];
static int cur; /* the current device */
static bool capturing;
static CUstream capture_stream;
static size_t limit, host_limit;
static uint64_t step;

struct live {
    uintptr_t p;
    size_t size;
    int fam, dev;
};
static struct live lives[MAXLIVE];
static size_t nlive;

/* ---- families ------------------------------------------------------------- */
enum { F_SERVED, F_ASYNC, F_MANAGED, F_HOST, F_VMM, NFAM };
struct family {
    const char *name;      /* as in the statistics' passthrough list ("served": runtimes) */
    bool device_limited;   /* under SPYRESHIM_LIMIT (else SPYRESHIM_HOST_LIMIT) */
    CUresult (*alloc)(uintptr_t *p, size_t size);
    CUresult (*free)(uintptr_t p);
    size_t small, large;   /* request sizes: small * (1..mult), sometimes large (0: never) */
    unsigned mult;
};

static CUresult served_alloc(uintptr_t *p, size_t size)
{
    CUdeviceptr d;
    CUresult rc = cuMemAlloc_v2(&d, size);
    *p = d;
    return rc;
}
static CUresult served_free(uintptr_t p)
{
    return cuMemFree_v2(p);
}
static CUresult async_alloc(uintptr_t *p, size_t size)
{
    CUdeviceptr d;
    CUstream s = streams[cur][below(NSTREAMS)];
    CUresult rc = below(2) ? cuMemAllocAsync(&d, size, s)
                           : cuMemAllocFromPoolAsync(&d, size, pools[cur], s);
    *p = d;
    return rc;
}
/* Any stream of the current device: often another than the allocation's. */
static CUresult async_free(uintptr_t p)
{
    return cuMemFreeAsync(p, streams[cur][below(NSTREAMS)]);
}
static CUresult managed_alloc(uintptr_t *p, size_t size)
{
    CUdeviceptr d;
    CUresult rc = cuMemAllocManaged(&d, size, CU_MEM_ATTACH_GLOBAL);
    *p = d;
    return rc;
}
static CUresult host_alloc(uintptr_t *p, size_t size)
{
    void *h;
    CUresult rc = cuMemHostAlloc(&h, size, 0);
    *p = (uintptr_t)h;
    return rc;
}
static CUresult host_free(uintptr_t p)
{
    return cuMemFreeHost((void *)p);
}

static CUresult vmm_alloc(uintptr_t *p, size_t size)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = cur;
    CUmemGenericAllocationHandle h = 0;
    CUresult rc = cuMemCreate(&h, size, &prop, 0);
    *p = (uintptr_t)h;
    return rc;
}
static CUresult vmm_free(uintptr_t p)
{
    return cuMemRelease((CUmemGenericAllocationHandle)p);
}

static const struct family FAMILIES[NFAM] = {
    [F_SERVED] = {"served", true, served_alloc, served_free, 512, 1 << 20, 64},
    [F_ASYNC] = {"cuda-async", true, async_alloc, async_free, 512, 1 << 20, 64},
    [F_MANAGED] = {"cuda-managed", true, managed_alloc, served_free, 4096, 1 << 20, 64},
    [F_HOST] = {"cuda-host-pinned", false, host_alloc, host_free, 4096, 1 << 20, 64},
    [F_VMM] = {"cuda-vmm", true, vmm_alloc, vmm_free, 2 << 20, 0, 1},
};

/* The model: live bytes, allocations and frees of each family per device
 * (host-pinned: device -1, kept in slot NDEV). */
static uint64_t model_bytes[NFAM][NDEV + 1], model_allocs[NFAM][NDEV + 1],
    model_frees[NFAM][NDEV + 1];
static int slot(int fam, int dev)
{
    return FAMILIES[fam].device_limited ? dev : NDEV;
}

static int failures;
#define FAIL(...)                                                 \
    do {                                                          \
        printf("step %llu FAIL: ", (unsigned long long)step);    \
        printf(__VA_ARGS__);                                      \
        printf("\n");                                             \
        if (++failures > 10)                                      \
            exit(failures);                                       \
    } while (0)

/* ---- checks ---------------------------------------------------------------- */
static int (*get_stats)(spyreshim_stats *);

static uint64_t sum(uint64_t a[NFAM][NDEV + 1], int fam)
{
    uint64_t t = 0;
    for (int d = 0; d <= NDEV; d++)
        t += a[fam][d];
    return t;
}

static void check_limits(void)
{
    for (int d = 0; d < NDEV; d++) {
        uint64_t held = 0;
        for (int f = 0; f < NFAM; f++)
            if (FAMILIES[f].device_limited)
                held += model_bytes[f][d];
        if (held > limit)
            FAIL("device %d holds %llu bytes over the limit %zu", d, (unsigned long long)held,
                 limit);
    }
    if (model_bytes[F_HOST][NDEV] > host_limit)
        FAIL("host-pinned %llu over the host limit %zu",
             (unsigned long long)model_bytes[F_HOST][NDEV], host_limit);
}

static void check_stats(void)
{
    spyreshim_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    if (get_stats(&s) != 0) {
        FAIL("spyreshim_get_stats");
        return;
    }
    struct {
        const char *what;
        uint64_t shim, model;
    } pairs[] = {
        {"used_bytes", s.used_bytes, sum(model_bytes, F_SERVED)},
        {"allocs", s.allocs, sum(model_allocs, F_SERVED)},
        {"frees", s.frees, sum(model_frees, F_SERVED)},
        {"async_bytes", s.async_bytes, sum(model_bytes, F_ASYNC)},
        {"async_allocs", s.async_allocs, sum(model_allocs, F_ASYNC)},
        {"async_frees", s.async_frees, sum(model_frees, F_ASYNC)},
        {"managed_bytes", s.managed_bytes, sum(model_bytes, F_MANAGED)},
        {"managed_allocs", s.managed_allocs, sum(model_allocs, F_MANAGED)},
        {"managed_frees", s.managed_frees, sum(model_frees, F_MANAGED)},
        {"host_pinned_bytes", s.host_pinned_bytes, sum(model_bytes, F_HOST)},
        {"host_pinned_allocs", s.host_pinned_allocs, sum(model_allocs, F_HOST)},
        {"host_pinned_frees", s.host_pinned_frees, sum(model_frees, F_HOST)},
        {"vmm_bytes", s.vmm_bytes, sum(model_bytes, F_VMM)},
        {"vmm_allocs", s.vmm_allocs, sum(model_allocs, F_VMM)},
        {"vmm_frees", s.vmm_frees, sum(model_frees, F_VMM)},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (pairs[i].shim != pairs[i].model)
            FAIL("%s: shim %llu, model %llu", pairs[i].what, (unsigned long long)pairs[i].shim,
                 (unsigned long long)pairs[i].model);
}

/* ---- operations ------------------------------------------------------------ */
static bool capture_error(CUresult rc)
{
    return rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED || rc == CUDA_ERROR_OUT_OF_MEMORY;
}

static void op_alloc(int fam)
{
    if (nlive == MAXLIVE)
        return;
    const struct family *f = &FAMILIES[fam];
    size_t size = f->large && below(16) == 0 ? f->large * (1 + below(2))
                                             : f->small * (1 + below(f->mult));
    uintptr_t p = 0;
    CUresult rc = f->alloc(&p, size);
    if (rc == CUDA_SUCCESS) {
        int s = slot(fam, cur);
        lives[nlive++] = (struct live){p, size, fam, f->device_limited ? cur : -1};
        model_bytes[fam][s] += size;
        model_allocs[fam][s]++;
        return;
    }
    /* Refusals the driver may give: out-of-memory (over the limit or the
     * device full), and during a capture its capture error. */
    if (rc == CUDA_ERROR_OUT_OF_MEMORY || (capturing && capture_error(rc)))
        return;
    FAIL("%s alloc of %zu: %d%s", f->name, size, rc, capturing ? " (capturing)" : "");
}

static void op_free(int fam)
{
    /* cuMemFree_v2 of managed memory reaches the driver: a synchronizing
     * call the program itself does not make during a capture (the count of
     * those is the shim's alone). */
    if (capturing && fam == F_MANAGED)
        return;
    /* A random live block of the family on the current device (host
     * memory: any). */
    size_t n = 0, pick = SIZE_MAX;
    for (size_t i = 0; i < nlive; i++)
        if (lives[i].fam == fam && (!FAMILIES[fam].device_limited || lives[i].dev == cur) &&
            below(++n) == 0)
            pick = i;
    if (pick == SIZE_MAX)
        return;
    struct live l = lives[pick];
    CUresult rc = FAMILIES[fam].free(l.p);
    if (rc != CUDA_SUCCESS) {
        FAIL("%s free: %d%s", FAMILIES[fam].name, rc, capturing ? " (capturing)" : "");
        return;
    }
    lives[pick] = lives[--nlive];
    int s = slot(fam, l.dev < 0 ? 0 : l.dev);
    model_bytes[fam][s] -= l.size;
    model_frees[fam][s]++;
}

static void op_switch_device(void)
{
    if (capturing)
        return; /* a capture stays on its thread's context */
    cur = (int)below(NDEV);
    if (cuCtxSetCurrent(ctx[cur]) != CUDA_SUCCESS)
        FAIL("cuCtxSetCurrent");
}

static void op_sync(void)
{
    if (capturing)
        return; /* the program itself never synchronizes during a capture */
    if (cuCtxSynchronize() != CUDA_SUCCESS)
        FAIL("cuCtxSynchronize");
}

static void op_trim(void)
{
    CUresult rc = cuMemPoolTrimTo(pools[cur], below(2) ? 0 : 1 << 20);
    if (rc != CUDA_SUCCESS)
        FAIL("cuMemPoolTrimTo: %d", rc);
}

static void op_capture(void)
{
    if (!capturing) {
        capture_stream = streams[cur][below(NSTREAMS)];
        CUstreamCaptureMode mode = below(2) ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                            : CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        if (cuStreamBeginCapture_v2(capture_stream, mode) != CUDA_SUCCESS)
            FAIL("cuStreamBeginCapture_v2");
        else
            capturing = true;
        return;
    }
    CUgraph g;
    CUresult rc = cuStreamEndCapture(capture_stream, &g);
    if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
        FAIL("cuStreamEndCapture: %d", rc);
    capturing = false;
}

/* Weights: allocations and frees of each family, then the others. */
static void one_op(void)
{
    unsigned r = below(100);
    if (r < 85) {
        int fam = (int)(r / 17);      /* 17 each: 9 allocations, 8 frees */
        if (r % 17 < 9)
            op_alloc(fam);
        else
            op_free(fam);
    } else if (r < 91) {
        op_switch_device();
    } else if (r < 94) {
        op_sync();
    } else if (r < 95) {
        op_trim();
    } else {
        op_capture();
    }
}

static size_t parse_size(const char *s)
{
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end == 'M')
        v <<= 20;
    return (size_t)v;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: cuda_model SEED OPS LIMIT HOST_LIMIT\n");
        return 2;
    }
    rng = strtoull(argv[1], NULL, 10) * 2 + 1;
    uint64_t ops = strtoull(argv[2], NULL, 10);
    limit = parse_size(argv[3]);
    host_limit = parse_size(argv[4]);
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "spyreshim_get_stats");
    unsigned long long (*syncs_during_capture)(void);
    *(void **)&syncs_during_capture = dlsym(RTLD_DEFAULT, "cudastandinSyncsDuringCapture");
    if (!get_stats || !syncs_during_capture) {
        printf("the shim (preloaded?) or the stand-in driver is missing\n");
        return 100;
    }
    if (cuInit(0) != CUDA_SUCCESS)
        return 100;
    for (int d = 0; d < NDEV; d++) {
        if (cuDevicePrimaryCtxRetain(&ctx[d], d) != CUDA_SUCCESS ||
            cuCtxSetCurrent(ctx[d]) != CUDA_SUCCESS || cuDeviceGetMemPool(&pools[d], d))
            return 100;
        for (int k = 0; k < NSTREAMS; k++)
            if (cuStreamCreate(&streams[d][k], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
                return 100;
    }
    cuCtxSetCurrent(ctx[cur]);
    for (step = 1; step <= ops; step++) {
        one_op();
        check_limits();
        check_stats();
    }
    /* The end: no capture, everything freed, the statistics at zero. */
    if (capturing) {
        CUgraph g;
        cuStreamEndCapture(capture_stream, &g);
        capturing = false;
    }
    while (nlive > 0) {
        cur = lives[nlive - 1].dev < 0 ? cur : lives[nlive - 1].dev;
        cuCtxSetCurrent(ctx[cur]);
        size_t before = nlive;
        op_free(lives[nlive - 1].fam);
        if (nlive == before) { /* op_free picks at random: free the last one directly */
            struct live l = lives[--nlive];
            if (FAMILIES[l.fam].free(l.p) != CUDA_SUCCESS)
                FAIL("final free");
            int s = slot(l.fam, l.dev < 0 ? 0 : l.dev);
            model_bytes[l.fam][s] -= l.size;
            model_frees[l.fam][s]++;
        }
    }
    check_stats();
    unsigned long long syncs = syncs_during_capture();
    if (syncs != 0)
        FAIL("%llu synchronizing calls during a capture", syncs);
    for (int f = 0; f < NFAM; f++)
        for (int d = 0; d <= NDEV; d++)
            if (model_allocs[f][d])
                printf("model %s %d %llu %llu\n", FAMILIES[f].name, d == NDEV ? -1 : d,
                       (unsigned long long)model_allocs[f][d],
                       (unsigned long long)model_frees[f][d]);
    printf("%s after %llu operations\n", failures ? "FAILED" : "ok", (unsigned long long)ops);
    fflush(stdout);
    return failures;
}
