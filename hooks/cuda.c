/* The CUDA runtime's entry points (libcudart). cudaError_t is an int-sized
 * enum: cudaErrorInvalidValue = 1, cudaErrorMemoryAllocation = 2. cudaMalloc
 * guarantees 256-byte alignment, so the shim's blocks keep it. */
#include "hooks.h"

#define CUDA_ENTRY_POINTS(X) \
    X(MALLOC, cudaMalloc)    \
    X(FREE, cudaFree)        \
    X(MEMINFO, cudaMemGetInfo)

SHIM_HOOK_RUNTIME("cuda", CUDA_ENTRY_POINTS, 1, 2, 256)
