/* legacy: the entry points of the 32-bit device-pointer ABI (before CUDA
 * 3.2), which the real driver still exports and hands out through
 * cuGetProcAddress for versions below 3020.
 *
 * No state and no lock: each one converts its arguments and calls the
 * current function. Device addresses here all lie above 4 GiB (separate
 * mmap reservations), so no allocation is representable in a 32-bit
 * CUdeviceptr: allocations through this ABI fail with
 * CUDA_ERROR_NOT_SUPPORTED instead of returning a truncated pointer, and a
 * 32-bit pointer passed in never names a live allocation (the checks of
 * the current functions then answer as for any unknown address). Sizes
 * reported through 32-bit outputs saturate. */
#include "internal.h"

#include <limits.h>

static unsigned saturate(size_t v)
{
    return v > UINT_MAX ? UINT_MAX : (unsigned)v;
}

/* Keeps p if it fits in 32 bits, else gives it back. */
static CUresult narrow(CUresult rc, CUdeviceptr p, CUdeviceptr_v1 *out)
{
    if (rc)
        return rc;
    if (p > UINT_MAX) {
        cuMemFree_v2(p);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    *out = (CUdeviceptr_v1)p;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t b;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuDeviceTotalMem_v2(&b, dev);
    if (rc == CUDA_SUCCESS)
        *bytes = saturate(b);
    return rc;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CUdeviceptr p = 0;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    return narrow(cuMemAlloc_v2(&p, bytesize), p, dptr);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    return cuMemFree_v2(dptr);
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
    size_t f, t;
    if (!free_bytes || !total)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = saturate(f);
        *total = saturate(t);
    }
    return rc;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    CUdeviceptr p = 0;
    size_t pitch;
    if (!dptr || !pPitch)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = narrow(cuMemAllocPitch_v2(&p, &pitch, WidthInBytes, Height, ElementSizeBytes),
                         p, dptr);
    if (rc == CUDA_SUCCESS)
        *pPitch = (unsigned)pitch;
    return rc;
}

CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr)
{
    CUdeviceptr b;
    size_t s;
    CUresult rc = cuMemGetAddressRange_v2(&b, &s, dptr);
    if (rc == CUDA_SUCCESS) {
        if (pbase)
            *pbase = (CUdeviceptr_v1)b;
        if (psize)
            *psize = saturate(s);
    }
    return rc;
}

CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
    return cuMemsetD8_v2(dstDevice, uc, N);
}

CUresult cuMemsetD32(CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N)
{
    return cuMemsetD32_v2(dstDevice, ui, N);
}

CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice, const void *srcHost,
                           unsigned int ByteCount, CUstream hStream)
{
    return cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream);
}

CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
                           CUstream hStream)
{
    return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice,
                           unsigned int ByteCount, CUstream hStream)
{
    return cuMemcpyDtoDAsync_v2(dstDevice, srcDevice, ByteCount, hStream);
}
