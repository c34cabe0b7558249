/* device: the devices' identity and properties, as numba and the CUDA
 * runtime query them.
 *
 * No lock: everything here is fixed once cuInit has run. The devices
 * describe themselves as compute capability 9.0 parts with the real
 * driver's attribute numbers; attributes we do not model read as 0 with
 * success, which is what a device lacking the feature reports and keeps
 * clients that probe many attributes (numba) going. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static CUresult check(CUdevice dev)
{
    CD_REQUIRE_INIT();
    return cd_device_valid(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceGetCount(int *count)
{
    CD_REQUIRE_INIT();
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = cd_opts.devices;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CD_REQUIRE_INIT();
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_device_valid(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult rc = check(dev);
    if (rc)
        return rc;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "CUDA stand-in device %d", dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult rc = check(dev);
    if (rc)
        return rc;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = cd_memory_capacity(dev);
    return CUDA_SUCCESS;
}

static int attribute(int attrib, CUdevice dev)
{
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case 2: case 3: return 1024;              /* MAX_BLOCK_DIM_X, _Y */
    case 4: return 64;                        /* MAX_BLOCK_DIM_Z */
    case 5: return 2147483647;                /* MAX_GRID_DIM_X */
    case 6: case 7: return 65535;             /* MAX_GRID_DIM_Y, _Z */
    case 8: return 48 * 1024;                 /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: return 64 * 1024;                 /* TOTAL_CONSTANT_MEMORY */
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case 11: return 2147483647;               /* MAX_PITCH */
    case 12: return 65536;                    /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1755000;                  /* CLOCK_RATE (kHz) */
    case 14: return 512;                      /* TEXTURE_ALIGNMENT */
    case 15: return 1;                        /* GPU_OVERLAP */
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case 19: return 1;                        /* CAN_MAP_HOST_MEMORY */
    case 20: return 0;                        /* COMPUTE_MODE: default */
    case 31: return 1;                        /* CONCURRENT_KERNELS */
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x10 + dev;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
    case 36: return 2619000;                  /* MEMORY_CLOCK_RATE (kHz) */
    case 37: return 5120;                     /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: return 50 * 1024 * 1024;         /* L2_CACHE_SIZE */
    case 39: return 2048;                     /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 40: return 2;                        /* ASYNC_ENGINE_COUNT */
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
    case 51: return 32;                       /* TEXTURE_PITCH_ALIGNMENT */
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case 78: return 1;                        /* STREAM_PRIORITIES_SUPPORTED */
    case 81: return 228 * 1024;               /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;                    /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 95: return 1;                        /* COOPERATIVE_LAUNCH */
    case 97: return 227 * 1024;               /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 106: return 32;                      /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    default: return 0;
    }
}

CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    CUresult rc = check(dev);
    if (rc)
        return rc;
    if (!pi || attrib <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = attribute(attrib, dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    CUresult rc = check(dev);
    if (rc)
        return rc;
    if (!major || !minor)
        return CUDA_ERROR_INVALID_VALUE;
    *major = 9;
    *minor = 0;
    return CUDA_SUCCESS;
}

/* Distinct per device and stable across runs. */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    CUresult rc = check(dev);
    if (rc)
        return rc;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    static const char prefix[15] = "cudastandin-dev";
    memcpy(uuid->bytes, prefix, sizeof prefix);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    CUresult rc = check(dev);
    if (rc)
        return rc;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0",
             (unsigned)attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev));
    return CUDA_SUCCESS;
}

/* Peer access would need one device's pointers to work on another's
 * streams, which the stand-in refuses on purpose (copy.c). */
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CUresult rc = check(dev);
    if (rc || (rc = check(peerDev)))
        return rc;
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = 0;
    return CUDA_SUCCESS;
}

/* Modules are not loaded at all; report eager loading (CU_MODULE_EAGER_LOADING). */
CUresult cuModuleGetLoadingMode(int *mode)
{
    CD_REQUIRE_INIT();
    if (!mode)
        return CUDA_ERROR_INVALID_VALUE;
    *mode = 1;
    return CUDA_SUCCESS;
}
