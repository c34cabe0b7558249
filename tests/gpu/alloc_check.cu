// A CUDA program for tests/gpu/run.sh: allocates through the runtime
// (cudaMalloc/cudaFree), writes every block with a kernel on a stream,
// frees while the kernel may still run, reallocates, checks contents, and
// times N cudaMalloc+cudaFree pairs. Prints one "key=value" line.
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cuda_runtime.h>

__global__ void fill(unsigned *p, size_t n, unsigned v)
{
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = v;
}

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    std::printf("error=%d where=%s\n", (int)e, #x); return 1; } } while (0)

int main(int argc, char **argv)
{
    int pairs = argc > 1 ? std::atoi(argv[1]) : 20000;
    size_t n = 1 << 20;
    unsigned *host = (unsigned *)std::malloc(n * sizeof *host);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int bad = 0;
    for (int round = 0; round < 16; round++) {
        unsigned *a, *b;
        CK(cudaMalloc(&a, n * sizeof *a));
        for (int k = 0; k < 8; k++)
            fill<<<256, 256, 0, s>>>(a, n, 0xAAAAAAAAu);
        CK(cudaFree(a));
        CK(cudaMalloc(&b, n * sizeof *b));
        fill<<<256, 256>>>(b, n, 0x55555555u);
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(host, b, n * sizeof *host, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < n; i++)
            if (host[i] != 0x55555555u) { bad++; break; }
        CK(cudaFree(b));
    }
    CK(cudaDeviceSynchronize());
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; i++) {
        void *p;
        CK(cudaMalloc(&p, 4096 + (size_t)(i % 64) * 4096));
        CK(cudaFree(p));
    }
    auto t1 = std::chrono::steady_clock::now();
    double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs;
    std::printf("corrupted_rounds=%d pair_ns=%.0f\n", bad, ns);
    return bad != 0;
}
