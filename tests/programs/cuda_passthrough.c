/* Checks of the memory the shim passes through to the driver and watches
 * (managed, host-pinned, virtual memory management), run against the
 * stand-in driver (tests/cudadrv) under LD_PRELOAD=libspyreshim.so by
 * tests/integration/test_cuda_passthrough.py and test_cuda_vmm.py. One
 * check per argument; each prints "<check> ok" or "<check> FAIL: why"; the
 * exit status is the number of failures. Linked with -lcuda.
 *
 *   managedlimit  under SPYRESHIM_LIMIT=4M: 3 MiB of managed memory, then
 *                 2 MiB more succeeds once the pressure callback frees the
 *                 first; 5 MiB more fails with CUDA_ERROR_OUT_OF_MEMORY after
 *                 a callback run that frees nothing
 *   hostlimit     the same with cuMemHostAlloc under SPYRESHIM_HOST_LIMIT=4M
 *                 (and no device limit in the way: 1M)
 *   teardown      managed memory of a created context, then cuCtxDestroy;
 *                 managed memory of the primary context, then its reset
 *   freeasync     cuMemFreeAsync of managed memory frees it
 * Prints "callbacks <n>" after each limit check (the pressure runs). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudadrv.h"

typedef struct spyreshim_lock spyreshim_lock;
typedef void (*pressure_fn)(spyreshim_lock *lock, size_t want, void *user);

static int failures;
static const char *check_name;
static CUcontext ctx0;

#define CHECK(cond, ...)                     \
    do {                                     \
        if (!(cond)) {                       \
            printf("%s FAIL: ", check_name); \
            printf(__VA_ARGS__);             \
            printf("\n");                    \
            failures++;                      \
            return;                          \
        }                                    \
    } while (0)

/* The pressure callback: counts its runs and frees the garbage it is
 * given (one managed or host-pinned allocation), as a collection would. */
static int callback_runs;
static CUdeviceptr garbage_managed;
static void *garbage_host;

static void on_pressure(spyreshim_lock *lock, size_t want, void *user)
{
    (void)lock, (void)want, (void)user;
    callback_runs++;
    if (garbage_managed) {
        cuMemFree_v2(garbage_managed);
        garbage_managed = 0;
    }
    if (garbage_host) {
        cuMemFreeHost(garbage_host);
        garbage_host = NULL;
    }
}

static int register_callback(void)
{
    int (*reg)(pressure_fn, void *);
    *(void **)&reg = dlsym(RTLD_DEFAULT, "spyreshim_register_pressure_callback");
    return reg ? reg(on_pressure, NULL) : -1;
}

__attribute__((noinline)) static void check_managedlimit(void)
{
    CHECK(register_callback() == 0, "the shim's pressure API (preloaded?)");
    CUdeviceptr a, b, c;
    CHECK(cuMemAllocManaged(&a, 3 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "3 MiB");
    garbage_managed = a;
    CUresult rc = cuMemAllocManaged(&b, 2 << 20, CU_MEM_ATTACH_GLOBAL);
    CHECK(rc == CUDA_SUCCESS, "2 MiB more after the callback freed 3: %d", rc);
    CHECK(callback_runs >= 1 && garbage_managed == 0, "the callback ran and freed (%d)",
          callback_runs);
    int before = callback_runs;
    rc = cuMemAllocManaged(&c, 3 << 20, CU_MEM_ATTACH_GLOBAL);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "3 MiB over the limit: %d", rc);
    CHECK(callback_runs > before, "no callback before the out-of-memory");
    /* Served memory shares the limit: 2 MiB live leave 2 MiB. */
    CUdeviceptr d;
    rc = cuMemAlloc_v2(&d, 3 << 20);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "3 MiB served next to 2 MiB managed: %d", rc);
    CHECK(cuMemFree_v2(b) == CUDA_SUCCESS, "free");
    CHECK(cuMemAllocManaged(&c, 3 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS,
          "3 MiB after the free");
    CHECK(cuMemFree_v2(c) == CUDA_SUCCESS, "free");
    printf("callbacks %d\n", callback_runs);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_hostlimit(void)
{
    CHECK(register_callback() == 0, "the shim's pressure API (preloaded?)");
    void *a, *b, *c;
    CHECK(cuMemHostAlloc(&a, 3 << 20, 0) == CUDA_SUCCESS, "3 MiB");
    garbage_host = a;
    CUresult rc = cuMemAllocHost_v2(&b, 2 << 20);
    CHECK(rc == CUDA_SUCCESS, "2 MiB more after the callback freed 3: %d", rc);
    CHECK(callback_runs >= 1 && garbage_host == NULL, "the callback ran and freed (%d)",
          callback_runs);
    int before = callback_runs;
    rc = cuMemHostAlloc(&c, 3 << 20, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "3 MiB over the host limit: %d", rc);
    CHECK(callback_runs > before, "no callback before the out-of-memory");
    static char reg[3 << 20] __attribute__((aligned(4096)));
    rc = cuMemHostRegister_v2(reg, sizeof reg, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "3 MiB registered over the host limit: %d", rc);
    CHECK(cuMemFreeHost(b) == CUDA_SUCCESS, "free");
    CHECK(cuMemHostRegister_v2(reg, sizeof reg, 0) == CUDA_SUCCESS, "registered after the free");
    CHECK(cuMemHostUnregister(reg) == CUDA_SUCCESS, "unregister");
    printf("callbacks %d\n", callback_runs);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_teardown(void)
{
    CUcontext mine;
    CUdeviceptr m, p;
    CHECK(cuCtxCreate_v2(&mine, 0, 0) == CUDA_SUCCESS, "cuCtxCreate");
    CHECK(cuMemAllocManaged(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "managed");
    CHECK(cuCtxDestroy_v2(mine) == CUDA_SUCCESS, "cuCtxDestroy");
    CHECK(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS, "primary current");
    CHECK(cuMemAllocManaged(&p, 2 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "managed");
    CHECK(cuDevicePrimaryCtxReset_v2(0) == CUDA_SUCCESS, "reset");
    /* The driver freed both: freeing them again is an unknown pointer. */
    CUresult rc = cuMemFree_v2(p);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE || rc == CUDA_ERROR_INVALID_CONTEXT,
          "free after the reset: %d", rc);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_freeasync(void)
{
    CUdeviceptr m;
    CHECK(cuMemAllocManaged(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "managed");
    CHECK(cuMemFreeAsync(m, NULL) == CUDA_SUCCESS, "cuMemFreeAsync");
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS, "sync");
    CUresult rc = cuMemFree_v2(m);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "free after cuMemFreeAsync: %d", rc);
    printf("%s ok\n", check_name);
}

int main(int argc, char **argv)
{
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx0, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx0) != CUDA_SUCCESS) {
        printf("no device\n");
        return 100;
    }
    static const struct { const char *name; void (*fn)(void); } checks[] = {
        {"managedlimit", check_managedlimit}, {"hostlimit", check_hostlimit},
        {"teardown", check_teardown}, {"freeasync", check_freeasync},
    };
    for (int i = 1; i < argc; i++) {
        size_t k = 0;
        while (k < sizeof checks / sizeof checks[0] && strcmp(checks[k].name, argv[i]) != 0)
            k++;
        if (k == sizeof checks / sizeof checks[0]) {
            printf("%s: unknown check\n", argv[i]);
            failures++;
            continue;
        }
        check_name = argv[i];
        checks[k].fn();
    }
    fflush(stdout);
    return failures;
}
