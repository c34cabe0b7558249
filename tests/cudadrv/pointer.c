/* pointer: what the driver tells about an address it allocated: the
 * allocation's range and pointer attributes (IPC handles: ipc.c).
 *
 * No lock of its own: everything comes from one locked lookup in memory.c.
 * All of these describe the whole driver allocation that contains the
 * address (suballocators on top must not change that). */
#include "internal.h"

#include <string.h>

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    CD_REQUIRE_INIT();
    if (!cd_context_current())
        return CUDA_ERROR_INVALID_CONTEXT;
    struct cd_block b;
    struct cd_host h;
    /* Host memory the device may address is an allocation too. */
    if (!cd_memory_find(dptr, 1, &b) && cd_host_find((void *)(uintptr_t)dptr, &h)) {
        if (pbase)
            *pbase = (uintptr_t)h.base;
        if (psize)
            *psize = h.size;
        return CUDA_SUCCESS;
    }
    /* The driver answers NOT_FOUND for an address it never allocated. */
    if (!cd_memory_find(dptr, 1, &b))
        return CUDA_ERROR_NOT_FOUND;
    if (pbase)
        *pbase = b.base;
    if (psize)
        *psize = b.size;
    return CUDA_SUCCESS;
}

/* Host memory the driver knows (pinned, registered, managed). */
static CUresult host_attribute(void *data, int attribute, CUdeviceptr ptr,
                               const struct cd_host *h)
{
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = h->ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = h->kind == CD_HOST_MANAGED ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned *)data = h->kind == CD_HOST_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = cd_context_device(h->ctx);
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = (uintptr_t)h->base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = h->size;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    CD_REQUIRE_INIT();
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    struct cd_block b;
    struct cd_host h;
    if (!cd_memory_find(ptr, 1, &b)) {
        if (cd_host_find((void *)(uintptr_t)ptr, &h))
            return host_attribute(data, attribute, ptr, &h);
        return CUDA_ERROR_INVALID_VALUE;
    }
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = b.ctx;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = b.dev;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = b.base;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = b.size;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = b.id;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned *)data = 0;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Unlike cuPointerGetAttribute, an address the driver does not know is no
 * error: every attribute gets its default (zero, NULL; the device ordinal
 * -2 as the driver reports it). */
CUresult cuPointerGetAttributes(unsigned int numAttributes, int *attributes, void **data,
                                CUdeviceptr ptr)
{
    CD_REQUIRE_INIT();
    if (!attributes || !data || numAttributes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct cd_block b;
    struct cd_host h;
    bool known = cd_memory_find(ptr, 1, &b) || cd_host_find((void *)(uintptr_t)ptr, &h);
    for (unsigned i = 0; i < numAttributes; i++) {
        if (!data[i])
            continue;
        if (known) {
            CUresult rc = cuPointerGetAttribute(data[i], attributes[i], ptr);
            if (rc != CUDA_SUCCESS)
                return rc;
            continue;
        }
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_CONTEXT:
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            *(void **)data[i] = NULL;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
            *(unsigned long long *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)data[i] = 0;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)data[i] = -2;
            break;
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned *)data[i] = 0;
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    return CUDA_SUCCESS;
}
