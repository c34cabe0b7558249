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
 *   nested        a pressure callback's own managed and host-pinned requests
 *                 past the limits (4M each) fail at once, without an event
 *   teardown      managed memory of a created context, then cuCtxDestroy;
 *                 managed memory of the primary context, then its reset
 *   freeasync     cuMemFreeAsync of managed memory frees it
 *   vmm           reserve, create, map, access, copies through the mapped
 *                 range, address range queries, the driver's errors, a
 *                 handle released while mapped living until unmapped, and
 *                 export to a POSIX fd and import mapping the same bytes
 *   vmmlimit      under SPYRESHIM_LIMIT=4M: 2 MiB, then 4 MiB more once the
 *                 pressure callback released the first; 2 MiB more fails
 *                 with CUDA_ERROR_OUT_OF_MEMORY after the callback
 *   vmmleak       one handle mapped, one not, both left live (leak report)
 *   vmmshare      export a mapped allocation's POSIX fd to a second process
 *                 (this program, exec'd with "vmmimport FD"), which imports,
 *                 maps and reads the bytes this one wrote, and writes back
 *   vmmroutes     cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap fetched
 *                 through cuGetProcAddress_v2 at 10020 and dlsym on the
 *                 driver's handle; prints "<route>:<name> <object>"
 * Prints "callbacks <n>" after each limit check (the pressure runs). */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checks.h"
#include "cudadrv.h"
#include "spyreshim.h"

typedef void (*pressure_fn)(spyreshim_lock *lock, size_t want, void *user);

/* The shim's VMM bytes live now; UINT64_MAX without the shim. */
static uint64_t shim_vmm_bytes(void)
{
    int (*get)(spyreshim_stats *);
    *(void **)&get = dlsym(RTLD_DEFAULT, "spyreshim_get_stats");
    spyreshim_stats s = {.size = sizeof s};
    return get && get(&s) == 0 ? s.vmm_bytes : UINT64_MAX;
}

static CUcontext ctx0;


/* The pressure callback: counts its runs and frees the garbage it is
 * given (one managed or host-pinned allocation), as a collection would. */
static int callback_runs;
static CUdeviceptr garbage_managed;
static void *garbage_host;
static CUmemGenericAllocationHandle garbage_vmm;

/* With `nested`, the callback itself asks for managed and host-pinned
 * memory past the limits first (a finalizer's allocation during a
 * collection): those must fail at once, with no pressure event of their
 * own (the runs would count more than one per event). */
static bool nested;
static CUresult nested_managed = -1, nested_host = -1;

static void on_pressure(spyreshim_lock *lock, size_t want, void *user)
{
    (void)lock, (void)want, (void)user;
    callback_runs++;
    if (nested) {
        CUdeviceptr m;
        void *h;
        nested_managed = cuMemAllocManaged(&m, 8 << 20, CU_MEM_ATTACH_GLOBAL);
        nested_host = cuMemHostAlloc(&h, 8 << 20, 0);
        nested = false;
    }
    if (garbage_managed) {
        cuMemFree_v2(garbage_managed);
        garbage_managed = 0;
    }
    if (garbage_host) {
        cuMemFreeHost(garbage_host);
        garbage_host = NULL;
    }
    if (garbage_vmm) {
        cuMemRelease(garbage_vmm);
        garbage_vmm = 0;
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

__attribute__((noinline)) static void check_nested(void)
{
    CHECK(register_callback() == 0, "the shim's pressure API (preloaded?)");
    CUdeviceptr a, b;
    CHECK(cuMemAllocManaged(&a, 3 << 20, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS, "3 MiB");
    garbage_managed = a;
    nested = true;
    CUresult rc = cuMemAllocManaged(&b, 2 << 20, CU_MEM_ATTACH_GLOBAL);
    CHECK(rc == CUDA_SUCCESS, "2 MiB more after the callback freed 3: %d", rc);
    CHECK(callback_runs == 1, "one callback run, not nested ones: %d", callback_runs);
    CHECK(nested_managed == CUDA_ERROR_OUT_OF_MEMORY && nested_host == CUDA_ERROR_OUT_OF_MEMORY,
          "the callback's own requests: %d %d", nested_managed, nested_host);
    CHECK(cuMemFree_v2(b) == CUDA_SUCCESS, "free");
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

#define MiB ((size_t)1 << 20)

static CUmemAllocationProp vmm_prop(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static CUresult vmm_access(CUdeviceptr va, size_t size, int dev)
{
    CUmemAccessDesc a = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return cuMemSetAccess(va, size, &a, 1);
}

__attribute__((noinline)) static void check_vmm(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
              CUDA_SUCCESS && gran == 2 * MiB, "granularity %zu", gran);
    size_t free0, free1, total;
    CHECK(cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS, "cuMemGetInfo");
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CUmemGenericAllocationHandle h, h2;
    CUresult rc = cuMemCreate(&h, 3 * MiB, &prop, 0);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "create of an unaligned size: %d", rc);
    CHECK(cuMemCreate(&h, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    CHECK(cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS && free0 - free1 == 2 * MiB,
          "the device's free memory went down by 2 MiB: %zu", free0 - free1);
    rc = cuMemMap(va + 4096, 2 * MiB, 0, h, 0);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "unaligned map: %d", rc);
    rc = cuMemMap(va + 8 * MiB, 2 * MiB, 0, h, 0);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "map past the reservation: %d", rc);
    CHECK(cuMemMap(va + 2 * MiB, 2 * MiB, 0, h, 0) == CUDA_SUCCESS, "map");
    char buf[64] = "bytes through a mapping", back[64] = {0};
    rc = cuMemcpyHtoD_v2(va + 2 * MiB + 100, buf, sizeof buf);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "copy before cuMemSetAccess: %d", rc);
    CHECK(vmm_access(va + 2 * MiB, 2 * MiB, 0) == CUDA_SUCCESS, "set access");
    CHECK(cuMemcpyHtoD_v2(va + 2 * MiB + 100, buf, sizeof buf) == CUDA_SUCCESS &&
              cuMemcpyDtoH_v2(back, va + 2 * MiB + 100, sizeof back) == CUDA_SUCCESS &&
              memcmp(buf, back, sizeof buf) == 0, "copies through the mapping");
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, va + 2 * MiB + 100) == CUDA_SUCCESS &&
              base == va + 2 * MiB && size == 2 * MiB,
          "address range of the mapping: %#llx %zu", base, size);
    rc = cuMemGetAddressRange_v2(&base, &size, va + 100);
    CHECK(rc == CUDA_ERROR_NOT_FOUND || rc == CUDA_ERROR_INVALID_VALUE,
          "address range of a reserved, unmapped address: %d", rc);
    /* Export, import: the same bytes at a second mapping. */
    int fd = -1;
    CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
              CUDA_SUCCESS && fd >= 0, "export");
    CHECK(cuMemImportFromShareableHandle(&h2, (void *)(intptr_t)fd,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) ==
              CUDA_SUCCESS, "import");
    CHECK(cuMemMap(va + 6 * MiB, 2 * MiB, 0, h2, 0) == CUDA_SUCCESS &&
              vmm_access(va + 6 * MiB, 2 * MiB, 0) == CUDA_SUCCESS, "map the import");
    memset(back, 0, sizeof back);
    CHECK(cuMemcpyDtoH_v2(back, va + 6 * MiB + 100, sizeof back) == CUDA_SUCCESS &&
              memcmp(buf, back, sizeof buf) == 0, "the import reads the same bytes");
    CHECK(cuMemUnmap(va + 6 * MiB, 2 * MiB) == CUDA_SUCCESS && cuMemRelease(h2) == CUDA_SUCCESS,
          "unmap and release the import");
    CUmemAllocationProp got;
    CHECK(cuMemGetAllocationPropertiesFromHandle(&got, h) == CUDA_SUCCESS &&
              got.location.id == 0, "properties");
    /* Released while mapped: the memory lives until it is unmapped. */
    CHECK(cuMemRelease(h) == CUDA_SUCCESS, "release while mapped");
    uint64_t live = shim_vmm_bytes();
    CHECK(live == UINT64_MAX || live == 2 * MiB, "the shim forgot it at the release: %llu",
          (unsigned long long)live);
    rc = cuMemRelease(h);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "second release: %d", rc);
    memset(back, 0, sizeof back);
    CHECK(cuMemcpyDtoH_v2(back, va + 2 * MiB + 100, sizeof back) == CUDA_SUCCESS &&
              memcmp(buf, back, sizeof buf) == 0, "still mapped after the release");
    rc = cuMemAddressFree(va, 8 * MiB);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "address free while mapped: %d", rc);
    rc = cuMemUnmap(va + 2 * MiB, 4 * MiB);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "unmap of a range not all mapped: %d", rc);
    CHECK(cuMemUnmap(va + 2 * MiB, 2 * MiB) == CUDA_SUCCESS, "unmap");
    CHECK(cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS && free1 == free0,
          "the memory is back after the unmap");
    live = shim_vmm_bytes();
    CHECK(live == UINT64_MAX || live == 0, "the shim kept it after the unmap: %llu",
          (unsigned long long)live);
    rc = cuMemcpyDtoH_v2(back, va + 2 * MiB + 100, sizeof back);
    CHECK(rc == CUDA_ERROR_INVALID_VALUE, "copy from an unmapped range: %d", rc);
    CHECK(cuMemAddressFree(va, 8 * MiB) == CUDA_SUCCESS, "address free");
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_vmmlimit(void)
{
    CHECK(register_callback() == 0, "the shim's pressure API (preloaded?)");
    CUmemAllocationProp prop = vmm_prop(0);
    CUmemGenericAllocationHandle a, b, c;
    CHECK(cuMemCreate(&a, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "2 MiB");
    garbage_vmm = a;
    CUresult rc = cuMemCreate(&b, 4 * MiB, &prop, 0);
    CHECK(rc == CUDA_SUCCESS, "4 MiB after the callback released 2: %d", rc);
    CHECK(callback_runs >= 1 && garbage_vmm == 0, "the callback ran and released (%d)",
          callback_runs);
    int before = callback_runs;
    rc = cuMemCreate(&c, 2 * MiB, &prop, 0);
    CHECK(rc == CUDA_ERROR_OUT_OF_MEMORY, "2 MiB over the limit: %d", rc);
    CHECK(callback_runs > before, "no callback before the out-of-memory");
    CHECK(cuMemRelease(b) == CUDA_SUCCESS, "release");
    CHECK(cuMemCreate(&c, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "2 MiB after the release");
    CHECK(cuMemRelease(c) == CUDA_SUCCESS, "release");
    printf("callbacks %d\n", callback_runs);
    printf("%s ok\n", check_name);
}

__attribute__((noinline)) static void check_vmmleak(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle mapped, unmapped;
    CHECK(cuMemAddressReserve(&va, 4 * MiB, 0, 0, 0) == CUDA_SUCCESS, "reserve");
    CHECK(cuMemCreate(&mapped, 4 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    CHECK(cuMemMap(va, 4 * MiB, 0, mapped, 0) == CUDA_SUCCESS, "map");
    CHECK(cuMemCreate(&unmapped, 2 * MiB, &prop, 0) == CUDA_SUCCESS, "create");
    printf("mapped at %#llx\n", va);
    printf("%s ok\n", check_name);
}

static const char share_msg[32] = "written by the exporter";
static const char reply_msg[32] = "written by the importer";
static const char *self_path;

__attribute__((noinline)) static void check_vmmshare(void)
{
    CUmemAllocationProp prop = vmm_prop(0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    CHECK(cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) == CUDA_SUCCESS &&
              cuMemCreate(&h, 2 * MiB, &prop, 0) == CUDA_SUCCESS &&
              cuMemMap(va, 2 * MiB, 0, h, 0) == CUDA_SUCCESS &&
              vmm_access(va, 2 * MiB, 0) == CUDA_SUCCESS, "reserve, create, map, access");
    CHECK(cuMemcpyHtoD_v2(va + 4096, share_msg, sizeof share_msg) == CUDA_SUCCESS, "write");
    int fd = -1;
    CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
              CUDA_SUCCESS, "export");
    fcntl(fd, F_SETFD, 0); /* handed to the child (a socket would do it too) */
    pid_t pid = fork();
    if (pid == 0) {
        char arg[16];
        snprintf(arg, sizeof arg, "%d", fd);
        execl(self_path, self_path, "vmmimport", arg, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid, "the importing process");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the importer failed: %d", st);
    char back[32] = {0};
    CHECK(cuMemcpyDtoH_v2(back, va + 8192, sizeof back) == CUDA_SUCCESS &&
              memcmp(back, reply_msg, sizeof back) == 0, "the importer's bytes");
    close(fd);
    CHECK(cuMemUnmap(va, 2 * MiB) == CUDA_SUCCESS && cuMemRelease(h) == CUDA_SUCCESS &&
              cuMemAddressFree(va, 2 * MiB) == CUDA_SUCCESS, "unmap, release, free");
    printf("%s ok\n", check_name);
}

/* The second process of vmmshare: argv[2] is the exported fd. */
static int vmmimport(const char *fdarg)
{
    int fd = atoi(fdarg);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    char back[32] = {0};
    if (cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS ||
        cuMemAddressReserve(&va, 2 * MiB, 0, 0, 0) != CUDA_SUCCESS ||
        cuMemMap(va, 2 * MiB, 0, h, 0) != CUDA_SUCCESS || vmm_access(va, 2 * MiB, 0) != 0 ||
        cuMemcpyDtoH_v2(back, va + 4096, sizeof back) != CUDA_SUCCESS ||
        memcmp(back, share_msg, sizeof back) != 0 ||
        cuMemcpyHtoD_v2(va + 8192, reply_msg, sizeof reply_msg) != CUDA_SUCCESS ||
        cuMemUnmap(va, 2 * MiB) != CUDA_SUCCESS || cuMemRelease(h) != CUDA_SUCCESS)
        return 1;
    return 0;
}

static void print_object(const char *route, const char *name, void *fn)
{
    Dl_info di;
    const char *obj = fn && dladdr(fn, &di) && di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
    printf("%s:%s %s\n", route, name, obj ? obj + 1 : "none");
}

__attribute__((noinline)) static void check_vmmroutes(void)
{
    static const char *const names[] = {"cuMemCreate", "cuMemRelease", "cuMemMap",
                                        "cuMemUnmap", "cuMemAddressReserve"};
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    CHECK(lib, "the driver's handle");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st;
        CHECK(cuGetProcAddress_v2(names[i], &fn, 10020, 0, &st) == CUDA_SUCCESS, "%s",
              names[i]);
        print_object("procaddr", names[i], fn);
        print_object("dlsym", names[i], dlsym(lib, names[i]));
    }
    printf("%s ok\n", check_name);
}

int main(int argc, char **argv)
{
    if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx0, 0) != CUDA_SUCCESS ||
        cuCtxSetCurrent(ctx0) != CUDA_SUCCESS) {
        printf("no device\n");
        return 100;
    }
    self_path = argv[0];
    if (argc == 3 && strcmp(argv[1], "vmmimport") == 0)
        return vmmimport(argv[2]);
    static const struct named_check checks[] = {
        {"managedlimit", check_managedlimit}, {"hostlimit", check_hostlimit},
        {"nested", check_nested}, {"teardown", check_teardown}, {"freeasync", check_freeasync}, {"vmm", check_vmm},
        {"vmmlimit", check_vmmlimit}, {"vmmleak", check_vmmleak},
        {"vmmroutes", check_vmmroutes}, {"vmmshare", check_vmmshare},
    };
    return run_checks(argc, argv, checks, sizeof checks / sizeof checks[0]);
}
