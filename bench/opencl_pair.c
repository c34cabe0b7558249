/* clCreateBuffer + clReleaseMemObject pairs on the first OpenCL device
 * (PoCL on the CPU here), run with and without the shim by
 * bench/opencl_pair.sh.
 *
 *   opencl_pair PAIRS [use]
 *
 * 1,000 buffers stay live (256 B .. 1 MiB, log-uniform, fixed seed); each
 * pair releases a random live buffer and creates a new one. With "use", a
 * kernel writes each new buffer before it goes into the live set, so that
 * the runtime backs it (PoCL allocates at first use) and frees have work
 * behind them; the kernel's time is in both runs. The buffers are released
 * at the end, outside the timing. Prints "pairs=N use=U ns_per_pair=X
 * cpu_ns_per_pair=Y": wall time, and the process's CPU time (every
 * thread's, PoCL's included), which a busy machine inflates less. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { LIVE_BUFFERS = 1000 };

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

static double clock_s(clockid_t c)
{
    struct timespec t;
    clock_gettime(c, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static double now(void)
{
    return clock_s(CLOCK_MONOTONIC);
}

#define CHECK(call)                                                          \
    do {                                                                     \
        cl_int e_ = (call);                                                  \
        if (e_ != CL_SUCCESS) {                                              \
            fprintf(stderr, "opencl_pair: %s = %d\n", #call, e_);            \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static const char *source = "__kernel void touch(__global uint *p) { p[0] = 1; }";

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: opencl_pair PAIRS [use]\n");
        return 2;
    }
    long pairs = strtol(argv[1], NULL, 0);
    int use = argc > 2 && strcmp(argv[2], "use") == 0;
    cl_platform_id plat;
    cl_device_id dev;
    CHECK(clGetPlatformIDs(1, &plat, NULL));
    CHECK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &source, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "touch", &err);
    CHECK(err);
    uint64_t seed = 42;
    cl_mem live[LIVE_BUFFERS];
    for (int i = 0; i < LIVE_BUFFERS; i++) {
        live[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size_of(&seed), NULL, &err);
        CHECK(err);
    }
    size_t one = 1;
    double t0 = now(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (long i = 0; i < pairs; i++) {
        size_t j = rng(&seed) % LIVE_BUFFERS;
        CHECK(clReleaseMemObject(live[j]));
        live[j] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size_of(&seed), NULL, &err);
        CHECK(err);
        if (use) {
            CHECK(clSetKernelArg(k, 0, sizeof live[j], &live[j]));
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
        }
    }
    CHECK(clFinish(q));
    double t1 = now(), c1 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    for (int i = 0; i < LIVE_BUFFERS; i++)
        CHECK(clReleaseMemObject(live[i]));
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    printf("pairs=%ld use=%d ns_per_pair=%.0f cpu_ns_per_pair=%.0f\n", pairs, use,
           (t1 - t0) * 1e9 / (double)pairs, (c1 - c0) * 1e9 / (double)pairs);
    return 0;
}
