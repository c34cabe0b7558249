/* The smallest CUDA driver the shim recognizes: the three memory functions
 * and nothing else (tests/integration/test_cuda_driver.py checks dlerror()
 * after a lookup on it). Nothing is served: every call fails as a driver
 * without a device does. The three carry a version (mini_driver.map), so
 * that dlvsym finds them. */
#include <stddef.h>

#define API __attribute__((visibility("default")))
#define CUDA_ERROR_NO_DEVICE 100

API int cuMemAlloc_v2(unsigned long long *dptr, size_t size)
{
    (void)dptr;
    (void)size;
    return CUDA_ERROR_NO_DEVICE;
}

API int cuMemFree_v2(unsigned long long dptr)
{
    (void)dptr;
    return CUDA_ERROR_NO_DEVICE;
}

API int cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    (void)free_bytes;
    (void)total;
    return CUDA_ERROR_NO_DEVICE;
}
