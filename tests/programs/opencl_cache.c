/* A C program linked to libOpenCL (the ICD loader, PoCL behind it) that
 * does what frameworks do with device memory, run by
 * tests/integration/test_opencl.py with and without the shim.
 *
 *   opencl_cache cache N MIB   N buffers of MIB MiB, each written by a
 *                              kernel, then parked in a cache instead of
 *                              released (as a framework's caching
 *                              allocator does); a pressure callback of the
 *                              shim, when the shim is there, empties it.
 *                              Without the shim the cache only grows.
 *   opencl_cache keep N MIB    N buffers all kept: the shim's limit answers
 *                              CL_MEM_OBJECT_ALLOCATION_FAILURE in
 *                              clCreateBuffer, which the program reports.
 *   opencl_cache leak          one 1 MiB buffer never released (in
 *                              leak_one_buffer), one released.
 *   opencl_cache watched       buffers the shim cannot serve
 *                              (CL_MEM_USE_HOST_PTR, CL_MEM_ALLOC_HOST_PTR)
 *                              and SVM, each checked by a kernel.
 *   opencl_cache info          what clGetDeviceInfo and clGetMemObjectInfo
 *                              answer, one "key=value" per line.
 *   opencl_cache routes        clCreateBuffer reached the three ways: as
 *                              linked, by dlsym on libOpenCL's handle, by
 *                              clGetExtensionFunctionAddressForPlatform;
 *                              each buffer made is checked by a kernel.
 *
 * Prints "<mode> ok ..." or "<mode> oom ..." and exits 0; 1 with a line on
 * anything else. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spyreshim.h"

static cl_context ctx;
static cl_command_queue queue;
static cl_device_id dev;
static cl_kernel fill_kernel;

#define CHECK(call)                                                               \
    do {                                                                          \
        cl_int e_ = (call);                                                       \
        if (e_ != CL_SUCCESS) {                                                   \
            fprintf(stderr, "opencl_cache: %s:%d: %s = %d\n", __FILE__, __LINE__, \
                    #call, e_);                                                   \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static const char *source =
    "__kernel void fill(__global uint *p, uint v) { p[get_global_id(0)] = v + get_global_id(0); }";

static void setup(void)
{
    cl_platform_id plat;
    cl_uint n = 0;
    CHECK(clGetPlatformIDs(1, &plat, &n));
    CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    cl_int err;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    queue = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &source, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    fill_kernel = clCreateKernel(prog, "fill", &err);
    CHECK(err);
    CHECK(clReleaseProgram(prog));
}

static void teardown(void)
{
    CHECK(clReleaseKernel(fill_kernel));
    CHECK(clReleaseCommandQueue(queue));
    CHECK(clReleaseContext(ctx));
}

/* The kernel writes v + i into the buffer's `words` words; a few are read
 * back. Returns 0 when they hold what it wrote. */
static int fill_and_check(cl_mem m, size_t words, cl_uint v)
{
    CHECK(clSetKernelArg(fill_kernel, 0, sizeof m, &m));
    CHECK(clSetKernelArg(fill_kernel, 1, sizeof v, &v));
    CHECK(clEnqueueNDRangeKernel(queue, fill_kernel, 1, NULL, &words, NULL, 0, NULL, NULL));
    size_t at[3] = {0, words / 2, words - 1};
    for (int k = 0; k < 3; k++) {
        cl_uint got = 0;
        CHECK(clEnqueueReadBuffer(queue, m, CL_TRUE, at[k] * 4, 4, &got, 0, NULL, NULL));
        if (got != v + (cl_uint)at[k]) {
            fprintf(stderr, "opencl_cache: word %zu holds %u, not %u\n", at[k], got,
                    v + (cl_uint)at[k]);
            return 1;
        }
    }
    return 0;
}

/* ---- the cache ------------------------------------------------------- */

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static cl_mem *cache;
static size_t ncache, emptied, callbacks;
static void (*lock_release)(spyreshim_lock *);
static void (*lock_acquire)(spyreshim_lock *);

/* The shim's pressure callback: the allocator lock is let go before the
 * cache's is taken (the lock contract), the buffers released with it
 * taken again. */
static void empty_cache(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    lock_release(lock);
    pthread_mutex_lock(&cache_mu);
    callbacks++;
    for (size_t i = 0; i < ncache; i++)
        clReleaseMemObject(cache[i]);
    emptied += ncache;
    ncache = 0;
    pthread_mutex_unlock(&cache_mu);
    lock_acquire(lock);
}

/* Registers the callback when the shim is loaded (looked up, not linked:
 * the program runs without it too). */
static int register_with_shim(void)
{
    int (*reg)(spyreshim_pressure_fn, void *) =
        (int (*)(spyreshim_pressure_fn, void *))dlsym(RTLD_DEFAULT,
                                                      "spyreshim_register_pressure_callback");
    lock_release = (void (*)(spyreshim_lock *))dlsym(RTLD_DEFAULT, "spyreshim_lock_release");
    lock_acquire = (void (*)(spyreshim_lock *))dlsym(RTLD_DEFAULT, "spyreshim_lock_acquire");
    if (!reg || !lock_release || !lock_acquire)
        return 0;
    return reg(empty_cache, NULL) == 0;
}

static int run_cache(size_t n, size_t mib, int keep)
{
    int shim = keep ? 0 : register_with_shim();
    cache = calloc(n, sizeof *cache);
    if (!cache)
        return 1;
    size_t bytes = mib << 20;
    for (size_t i = 0; i < n; i++) {
        cl_int err;
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
        if (!m) {
            if (err != CL_MEM_OBJECT_ALLOCATION_FAILURE) {
                fprintf(stderr, "opencl_cache: clCreateBuffer = %d\n", err);
                return 1;
            }
            printf("%s oom made=%zu shim=%d callbacks=%zu emptied=%zu\n", keep ? "keep" : "cache",
                   i, shim, callbacks, emptied);
            return 0;
        }
        if (fill_and_check(m, bytes / 4, (cl_uint)i))
            return 1;
        pthread_mutex_lock(&cache_mu);
        cache[ncache++] = m;
        pthread_mutex_unlock(&cache_mu);
    }
    CHECK(clFinish(queue));
    for (size_t i = 0; i < ncache; i++)
        CHECK(clReleaseMemObject(cache[i]));
    printf("%s ok made=%zu shim=%d callbacks=%zu emptied=%zu\n", keep ? "keep" : "cache", n, shim,
           callbacks, emptied);
    return 0;
}

/* ---- a leak ---------------------------------------------------------- */

static cl_mem __attribute__((noinline)) leak_one_buffer(size_t bytes)
{
    cl_int err;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    CHECK(err);
    return m;
}

static int run_leak(void)
{
    cl_mem leaked = leak_one_buffer(1 << 20);
    cl_int err;
    cl_mem freed = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    CHECK(err);
    if (fill_and_check(leaked, (1 << 20) / 4, 7) || fill_and_check(freed, 1024, 9))
        return 1;
    CHECK(clReleaseMemObject(freed));
    /* The context and the leaked buffer are left to the process's exit, as
     * a program that forgets a buffer does. */
    printf("leak ok\n");
    return 0;
}

/* ---- buffers the shim does not serve ---------------------------------- */

static int run_watched(void)
{
    size_t bytes = 1 << 20;
    cl_uint *host = aligned_alloc(4096, bytes);
    if (!host)
        return 1;
    cl_int err;
    cl_mem use = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, bytes, host, &err);
    CHECK(err);
    cl_mem alloc = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL, &err);
    CHECK(err);
    if (fill_and_check(use, bytes / 4, 3) || fill_and_check(alloc, bytes / 4, 4))
        return 1;
    /* A USE_HOST_PTR buffer is the host's memory: the kernel's writes are
     * there once the buffer is mapped. */
    void *p = clEnqueueMapBuffer(queue, use, CL_TRUE, CL_MAP_READ, 0, bytes, 0, NULL, NULL, &err);
    CHECK(err);
    if (p != host || host[5] != 3 + 5) {
        fprintf(stderr, "opencl_cache: USE_HOST_PTR buffer maps to %p (host %p), word 5 = %u\n", p,
                (void *)host, host[5]);
        return 1;
    }
    CHECK(clEnqueueUnmapMemObject(queue, use, p, 0, NULL, NULL));
    int svm = 0;
    cl_device_svm_capabilities caps = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL) == CL_SUCCESS &&
        (caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)) {
        void *s = clSVMAlloc(ctx, CL_MEM_READ_WRITE, bytes, 0);
        if (!s) {
            fprintf(stderr, "opencl_cache: clSVMAlloc gave NULL\n");
            return 1;
        }
        CHECK(clSetKernelArgSVMPointer(fill_kernel, 0, s));
        cl_uint v = 11;
        CHECK(clSetKernelArg(fill_kernel, 1, sizeof v, &v));
        size_t words = bytes / 4;
        CHECK(clEnqueueNDRangeKernel(queue, fill_kernel, 1, NULL, &words, NULL, 0, NULL, NULL));
        CHECK(clEnqueueSVMMap(queue, CL_TRUE, CL_MAP_READ, s, bytes, 0, NULL, NULL));
        if (((cl_uint *)s)[words - 1] != 11 + words - 1) {
            fprintf(stderr, "opencl_cache: SVM word %zu = %u\n", words - 1,
                    ((cl_uint *)s)[words - 1]);
            return 1;
        }
        CHECK(clEnqueueSVMUnmap(queue, s, 0, NULL, NULL));
        CHECK(clFinish(queue));
        clSVMFree(ctx, s);
        svm = 1;
    }
    CHECK(clReleaseMemObject(use));
    CHECK(clReleaseMemObject(alloc));
    free(host);
    printf("watched ok svm=%d\n", svm);
    return 0;
}

/* ---- what the runtime answers ------------------------------------------ */

static int run_info(void)
{
    cl_ulong global = 0, max_alloc = 0;
    cl_uint align = 0;
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL));
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL));
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align, &align, NULL));
    printf("global_mem_size=%llu\nmax_mem_alloc_size=%llu\nmem_base_addr_align=%u\n",
           (unsigned long long)global, (unsigned long long)max_alloc, align);
    cl_int err;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_ONLY, 10000, NULL, &err);
    CHECK(err);
    cl_mem_flags flags = 0;
    size_t size = 0, offset = 1;
    cl_mem assoc = (cl_mem)1;
    void *host = (void *)1;
    cl_uint refs = 0;
    CHECK(clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof flags, &flags, NULL));
    CHECK(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL));
    CHECK(clGetMemObjectInfo(m, CL_MEM_OFFSET, sizeof offset, &offset, NULL));
    CHECK(clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL));
    CHECK(clGetMemObjectInfo(m, CL_MEM_HOST_PTR, sizeof host, &host, NULL));
    CHECK(clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL));
    printf("flags=%llu\nsize=%zu\noffset=%zu\nassociated=%d\nhost_ptr=%d\nrefs=%u\n",
           (unsigned long long)flags, size, offset, assoc != NULL, host != NULL, refs);
    /* A second reference: one release leaves the buffer usable. */
    CHECK(clRetainMemObject(m));
    CHECK(clReleaseMemObject(m));
    if (fill_and_check(m, 2500, 5))
        return 1;
    CHECK(clReleaseMemObject(m));
    /* Sizes the runtime refuses, as it refuses them. */
    cl_mem z = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 0, NULL, &err);
    printf("zero_size=%d\n", z ? 0 : err);
    cl_mem huge = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)max_alloc + 1, NULL, &err);
    printf("over_max=%d\n", huge ? 0 : err);
    /* Exactly the largest buffer the device said it makes: made (PoCL
     * allocates at first use, so no memory is taken here). */
    cl_mem at_max = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)max_alloc, NULL, &err);
    printf("at_max=%d\n", at_max ? 0 : err);
    if (at_max)
        CHECK(clReleaseMemObject(at_max));
    cl_mem bad = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY, 64, NULL, &err);
    printf("bad_flags=%d\n", bad ? 0 : err);
    printf("info ok\n");
    return 0;
}

/* ---- the routes to clCreateBuffer -------------------------------------- */

typedef cl_mem (*create_fn)(cl_context, cl_mem_flags, size_t, void *, cl_int *);

static int run_routes(void)
{
    void *h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
    create_fn by_dlsym = h ? (create_fn)dlsym(h, "clCreateBuffer") : NULL;
    cl_platform_id plat;
    CHECK(clGetPlatformIDs(1, &plat, NULL));
    create_fn by_icd = (create_fn)clGetExtensionFunctionAddressForPlatform(plat, "clCreateBuffer");
    /* The ICD route hands out a core function only where the runtime does
     * (PoCL does not): "none", the linked one, or another. */
    printf("dlsym_is_linked=%d\nicd=%s\n", by_dlsym == clCreateBuffer,
           !by_icd ? "none" : by_icd == clCreateBuffer ? "linked" : "other");
    create_fn fns[3] = {clCreateBuffer, by_dlsym, by_icd};
    for (int k = 0; k < 3; k++) {
        if (!fns[k])
            continue;
        cl_int err;
        cl_mem m = fns[k](ctx, CL_MEM_READ_WRITE, 1 << 16, NULL, &err);
        CHECK(err);
        if (fill_and_check(m, (1 << 16) / 4, (cl_uint)k))
            return 1;
        CHECK(clReleaseMemObject(m));
    }
    if (h)
        dlclose(h);
    printf("routes ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: opencl_cache cache|keep N MIB | leak | watched | info | routes\n");
        return 2;
    }
    setup();
    int rc;
    if ((!strcmp(argv[1], "cache") || !strcmp(argv[1], "keep")) && argc == 4)
        rc = run_cache(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0),
                       !strcmp(argv[1], "keep"));
    else if (!strcmp(argv[1], "leak"))
        return run_leak();
    else if (!strcmp(argv[1], "watched"))
        rc = run_watched();
    else if (!strcmp(argv[1], "info"))
        rc = run_info();
    else if (!strcmp(argv[1], "routes"))
        rc = run_routes();
    else {
        fprintf(stderr, "opencl_cache: unknown mode %s\n", argv[1]);
        return 2;
    }
    teardown();
    return rc;
}
