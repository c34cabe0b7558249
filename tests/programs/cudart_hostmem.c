/* The stand-in runtime's host-pinned and managed memory (tests/cuda_standin:
 * cudaHostAlloc, cudaMallocHost, cudaMallocManaged, cudaFreeHost, cudaFree),
 * which reaches the driver the way the real runtime does (cuGetProcAddress),
 * under LD_PRELOAD=libspyreshim.so with the stand-in driver on
 * LD_LIBRARY_PATH (tests/integration/test_cuda_passthrough.py). Prints
 * "cudart ok" or "cudart FAIL: why". With "leak", leaves one of each live. */
#include <stdio.h>
#include <string.h>

int cudaHostAlloc(void **ptr, size_t size, unsigned flags);
int cudaMallocHost(void **ptr, size_t size);
int cudaFreeHost(void *ptr);
int cudaMallocManaged(void **ptr, size_t size, unsigned flags);
int cudaFree(void *ptr);

#define CHECK(cond, what)                          \
    do {                                           \
        if (!(cond)) {                             \
            printf("cudart FAIL: %s\n", what);     \
            return 1;                              \
        }                                          \
    } while (0)

__attribute__((noinline)) int cudart_allocated_here(int keep)
{
    void *a, *b, *m;
    CHECK(cudaHostAlloc(&a, 1 << 20, 0) == 0, "cudaHostAlloc");
    CHECK(cudaMallocHost(&b, 65536) == 0, "cudaMallocHost");
    CHECK(cudaMallocManaged(&m, 2 << 20, 1) == 0, "cudaMallocManaged");
    memset(a, 1, 1 << 20); /* host memory: the program may touch it */
    if (!keep) {
        CHECK(cudaFreeHost(a) == 0 && cudaFreeHost(b) == 0, "cudaFreeHost");
        CHECK(cudaFree(m) == 0, "cudaFree of managed memory");
        CHECK(cudaFreeHost(a) == 1, "second cudaFreeHost: invalid value");
    }
    /* Over the device limit: out of memory (cudaErrorMemoryAllocation). */
    void *big;
    CHECK(cudaMallocManaged(&big, 8 << 20, 1) == 2, "managed over the limit");
    printf("cudart ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    return cudart_allocated_here(argc > 1 && strcmp(argv[1], "leak") == 0);
}
