/* A shared object that allocates device memory for its caller, standing
 * for a library that exports its buffers (libnccl): the shim's
 * SPYRESHIM_CUDA_IPC_CALLERS names it by file name (libipccaller), and its
 * requests get a region of their own (tests/programs/cuda_ipc.c, pattern
 * "caller"). */
#include "cudadrv.h"

__attribute__((visibility("default"))) unsigned ipc_caller_allocs;

/* Not a tail call: cuMemAlloc_v2's return address must lie in this object,
 * as it lies in libnccl (its static CUDA runtime) for NCCL's buffers. */
__attribute__((visibility("default"))) CUresult ipc_caller_alloc(CUdeviceptr *p, size_t n)
{
    CUresult rc = cuMemAlloc_v2(p, n);
    __atomic_add_fetch(&ipc_caller_allocs, 1, __ATOMIC_RELAXED);
    return rc;
}
