/* cudadrv: a CPU stand-in for the CUDA driver (libcuda.so.1), for tests.
 *
 * Our own declarations of the driver API subset the stand-in exports, with
 * the real driver's types, constants and error numbers (checked against
 * cuda.h, which is never needed to build). Test programs include this
 * instead of cuda.h so that they build on machines without a toolkit.
 *
 * Configuration (read once, at cuInit):
 *   CUDASTANDIN_DEVICES      number of devices (1..16, default 2)
 *   CUDASTANDIN_MEMORY       capacity per device, bytes with K/M/G/T
 *                            (default 1G), or a list "256M,1G" (one per
 *                            device; the last repeats)
 *   CUDASTANDIN_OP_DELAY_US  sleep before each queued operation runs
 *                            (default 0), to make asynchrony observable
 *   CUDA_VISIBLE_DEVICES     as the real driver: the listed devices of the
 *                            above, renumbered from 0, up to the first
 *                            entry that is not one (empty: no device)
 *
 * Device memory is an address range the host cannot touch (a load or store
 * through a device pointer faults); only the memset/memcpy functions move
 * bytes, on the stream worker threads. */
#ifndef CUDADRV_H
#define CUDADRV_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUAPI __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef unsigned long long cuuint64_t;
typedef struct cd_ctx *CUcontext;
typedef struct cd_stream *CUstream;
typedef struct cd_event *CUevent;
typedef void (*CUstreamCallback)(CUstream hStream, CUresult status, void *userData);
typedef int CUdriverProcAddressQueryResult;
typedef int CUstreamCaptureMode;
typedef int CUstreamCaptureStatus;
typedef struct cd_graph *CUgraph;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[64]; } CUipcMemHandle;
/* Virtual memory management (vmm.c): cuda.h's types. */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUmemAllocationHandleType;
typedef int CUmemAllocationGranularity_flags;
typedef struct CUmemLocation_st {
    int type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    int type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;
enum { CU_MEM_ALLOCATION_TYPE_INVALID = 0, CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum { CU_MEM_HANDLE_TYPE_NONE = 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 };
enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1 };
enum { CU_MEM_ACCESS_FLAGS_PROT_NONE = 0, CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
       CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 };
typedef unsigned CUmemAccess_flags; /* cuda.h's enum */
enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 };
/* Stream-ordered pools (mempool.c): cuda.h's types. */
typedef struct cd_mempool *CUmemoryPool;
typedef int CUmemPool_attribute;
typedef struct CUmemPoolProps_st {
    int allocType;                  /* CU_MEM_ALLOCATION_TYPE_PINNED */
    CUmemAllocationHandleType handleTypes; /* CU_MEM_HANDLE_TYPE_NONE */
    CUmemLocation location;         /* CU_MEM_LOCATION_TYPE_DEVICE, ordinal */
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_CONTEXT_ALREADY_CURRENT = 202,
    CUDA_ERROR_MAP_FAILED = 205,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE = 708,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_UNKNOWN = 999,
};

#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
enum { CU_STREAM_DEFAULT = 0, CU_STREAM_NON_BLOCKING = 1 };
enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
       CU_STREAM_CAPTURE_MODE_RELAXED = 2 };
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
       CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 };
enum { CU_EVENT_DEFAULT = 0, CU_EVENT_BLOCKING_SYNC = 1, CU_EVENT_DISABLE_TIMING = 2,
       CU_EVENT_INTERPROCESS = 4 };
enum { CU_GET_PROC_ADDRESS_DEFAULT = 0, CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 };
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
       CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 };
enum { CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
       CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3, CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
       CU_POINTER_ATTRIBUTE_BUFFER_ID = 7, CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
       CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12 };
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };
enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };
enum { CU_MEMHOSTALLOC_PORTABLE = 1, CU_MEMHOSTALLOC_DEVICEMAP = 2,
       CU_MEMHOSTALLOC_WRITECOMBINED = 4 };
enum { CU_MEMHOSTREGISTER_PORTABLE = 1, CU_MEMHOSTREGISTER_DEVICEMAP = 2,
       CU_MEMHOSTREGISTER_IOMEMORY = 4, CU_MEMHOSTREGISTER_READ_ONLY = 8 };
enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};

/* The driver version reported: what the CUDA 13.0 runtime requires. */
#define CUDASTANDIN_DRIVER_VERSION 13000

/* Every exported function: X(return type, name, parameters). procaddr.c's
 * table (entries.h) says which of them answer which cuGetProcAddress
 * request; this list only declares them. */
#define CUDADRV_FUNCTIONS(X) \
    X(CUresult, cuInit, (unsigned int flags)) \
    X(CUresult, cuDriverGetVersion, (int *version)) \
    X(CUresult, cuGetErrorString, (CUresult error, const char **str)) \
    X(CUresult, cuGetErrorName, (CUresult error, const char **str)) \
    X(CUresult, cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, \
                                   cuuint64_t flags)) \
    X(CUresult, cuGetProcAddress_v2, (const char *symbol, void **pfn, int cudaVersion, \
                                      cuuint64_t flags, \
                                      CUdriverProcAddressQueryResult *symbolStatus)) \
    X(CUresult, cuDeviceGetCount, (int *count)) \
    X(CUresult, cuDeviceGet, (CUdevice *device, int ordinal)) \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev)) \
    X(CUresult, cuDeviceTotalMem, (unsigned int *bytes, CUdevice dev)) \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev)) \
    X(CUresult, cuDeviceGetAttribute, (int *pi, int attrib, CUdevice dev)) \
    X(CUresult, cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev)) \
    X(CUresult, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev)) \
    X(CUresult, cuDeviceComputeCapability, (int *major, int *minor, CUdevice dev)) \
    X(CUresult, cuDeviceGetPCIBusId, (char *pciBusId, int len, CUdevice dev)) \
    X(CUresult, cuDeviceCanAccessPeer, (int *canAccessPeer, CUdevice dev, CUdevice peerDev)) \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease, (CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxReset, (CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev)) \
    X(CUresult, cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active)) \
    X(CUresult, cuDevicePrimaryCtxSetFlags, (CUdevice dev, unsigned int flags)) \
    X(CUresult, cuDevicePrimaryCtxSetFlags_v2, (CUdevice dev, unsigned int flags)) \
    X(CUresult, cuCtxCreate, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(CUresult, cuCtxDestroy, (CUcontext ctx)) \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx)) \
    X(CUresult, cuCtxPushCurrent, (CUcontext ctx)) \
    X(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx)) \
    X(CUresult, cuCtxPopCurrent, (CUcontext *pctx)) \
    X(CUresult, cuCtxPopCurrent_v2, (CUcontext *pctx)) \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx)) \
    X(CUresult, cuCtxGetCurrent, (CUcontext *pctx)) \
    X(CUresult, cuCtxGetDevice, (CUdevice *device)) \
    X(CUresult, cuCtxGetDevice_v2, (CUdevice *device, CUcontext ctx)) \
    X(CUresult, cuCtxSynchronize, (void)) \
    X(CUresult, cuCtxSynchronize_v2, (CUcontext ctx)) \
    X(CUresult, cuStreamCreate, (CUstream *phStream, unsigned int flags)) \
    X(CUresult, cuStreamCreateWithPriority, (CUstream *phStream, unsigned int flags, \
                                             int priority)) \
    X(CUresult, cuStreamDestroy, (CUstream hStream)) \
    X(CUresult, cuStreamDestroy_v2, (CUstream hStream)) \
    X(CUresult, cuStreamSynchronize, (CUstream hStream)) \
    X(CUresult, cuStreamQuery, (CUstream hStream)) \
    X(CUresult, cuStreamBeginCapture, (CUstream hStream)) \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode)) \
    X(CUresult, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph)) \
    X(CUresult, cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *status)) \
    X(CUresult, cuStreamGetCaptureInfo, (CUstream hStream, CUstreamCaptureStatus *status, \
                                         cuuint64_t *id)) \
    X(CUresult, cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode)) \
    X(CUresult, cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int flags)) \
    X(CUresult, cuEventCreate, (CUevent *phEvent, unsigned int flags)) \
    X(CUresult, cuEventRecord, (CUevent hEvent, CUstream hStream)) \
    X(CUresult, cuEventSynchronize, (CUevent hEvent)) \
    X(CUresult, cuEventQuery, (CUevent hEvent)) \
    X(CUresult, cuEventElapsedTime, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
    X(CUresult, cuEventElapsedTime_v2, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
    X(CUresult, cuEventDestroy, (CUevent hEvent)) \
    X(CUresult, cuEventDestroy_v2, (CUevent hEvent)) \
    X(CUresult, cuMemAlloc, (CUdeviceptr_v1 *dptr, unsigned int bytesize)) \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize)) \
    X(CUresult, cuMemFree, (CUdeviceptr_v1 dptr)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr)) \
    X(CUresult, cuMemGetInfo, (unsigned int *free, unsigned int *total)) \
    X(CUresult, cuMemGetInfo_v2, (size_t *free, size_t *total)) \
    X(CUresult, cuMemAllocPitch, (CUdeviceptr_v1 *dptr, unsigned int *pPitch, \
                                  unsigned int WidthInBytes, unsigned int Height, \
                                  unsigned int ElementSizeBytes)) \
    X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, \
                                     size_t Height, unsigned int ElementSizeBytes)) \
    X(CUresult, cuMemGetAddressRange, (CUdeviceptr_v1 *pbase, unsigned int *psize, \
                                       CUdeviceptr_v1 dptr)) \
    X(CUresult, cuMemGetAddressRange_v2, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)) \
    X(CUresult, cuPointerGetAttribute, (void *data, int attribute, CUdeviceptr ptr)) \
    X(CUresult, cuIpcGetMemHandle, (CUipcMemHandle *pHandle, CUdeviceptr dptr)) \
    X(CUresult, cuIpcOpenMemHandle, (CUdeviceptr *pdptr, CUipcMemHandle handle, \
                                     unsigned int Flags)) \
    X(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr *pdptr, CUipcMemHandle handle, \
                                        unsigned int Flags)) \
    X(CUresult, cuIpcCloseMemHandle, (CUdeviceptr dptr)) \
    X(CUresult, cuMemsetD8, (CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)) \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N)) \
    X(CUresult, cuMemsetD32, (CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N)) \
    X(CUresult, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N)) \
    X(CUresult, cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N, \
                                  CUstream hStream)) \
    X(CUresult, cuMemsetD32Async, (CUdeviceptr dstDevice, unsigned int ui, size_t N, \
                                   CUstream hStream)) \
    X(CUresult, cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)) \
    X(CUresult, cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, \
                                CUstream hStream)) \
    X(CUresult, cuMemcpyHtoD, (CUdeviceptr_v1 dstDevice, const void *srcHost, \
                               unsigned int ByteCount)) \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)) \
    X(CUresult, cuMemcpyDtoH, (void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)) \
    X(CUresult, cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)) \
    X(CUresult, cuMemcpyDtoD, (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, \
                               unsigned int ByteCount)) \
    X(CUresult, cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, \
                                  size_t ByteCount)) \
    X(CUresult, cuMemcpyHtoDAsync, (CUdeviceptr_v1 dstDevice, const void *srcHost, \
                                    unsigned int ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr dstDevice, const void *srcHost, \
                                       size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyDtoHAsync, (void *dstHost, CUdeviceptr_v1 srcDevice, \
                                    unsigned int ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyDtoHAsync_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, \
                                       CUstream hStream)) \
    X(CUresult, cuMemcpyDtoDAsync, (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, \
                                    unsigned int ByteCount, CUstream hStream)) \
    X(CUresult, cuMemcpyDtoDAsync_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, \
                                       size_t ByteCount, CUstream hStream)) \
    X(CUresult, cuModuleGetLoadingMode, (int *mode)) \
    X(CUresult, cuPointerGetAttributes, (unsigned int numAttributes, int *attributes, \
                                         void **data, CUdeviceptr ptr)) \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream)) \
    X(CUresult, cuMemAllocHost, (void **pp, unsigned int bytesize)) \
    X(CUresult, cuMemAllocHost_v2, (void **pp, size_t bytesize)) \
    X(CUresult, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags)) \
    X(CUresult, cuMemFreeHost, (void *p)) \
    X(CUresult, cuMemHostRegister, (void *p, size_t bytesize, unsigned int Flags)) \
    X(CUresult, cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags)) \
    X(CUresult, cuMemHostUnregister, (void *p)) \
    X(CUresult, cuMemHostGetDevicePointer, (CUdeviceptr_v1 *pdptr, void *p, unsigned int Flags)) \
    X(CUresult, cuMemHostGetDevicePointer_v2, (CUdeviceptr *pdptr, void *p, unsigned int Flags)) \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags)) \
    X(CUresult, cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, \
                                      CUdeviceptr addr, unsigned long long flags)) \
    X(CUresult, cuMemAddressFree, (CUdeviceptr ptr, size_t size)) \
    X(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, \
                              const CUmemAllocationProp *prop, unsigned long long flags)) \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle)) \
    X(CUresult, cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, \
                           CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size)) \
    X(CUresult, cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, \
                                 size_t count)) \
    X(CUresult, cuMemGetAllocationGranularity, (size_t *granularity, \
                                                const CUmemAllocationProp *prop, \
                                                CUmemAllocationGranularity_flags option)) \
    X(CUresult, cuMemExportToShareableHandle, (void *shareableHandle, \
                                               CUmemGenericAllocationHandle handle, \
                                               CUmemAllocationHandleType handleType, \
                                               unsigned long long flags)) \
    X(CUresult, cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *handle, \
                                                 void *osHandle, \
                                                 CUmemAllocationHandleType shHandleType)) \
    X(CUresult, cuMemGetAllocationPropertiesFromHandle, (CUmemAllocationProp *prop, \
                                                         CUmemGenericAllocationHandle handle)) \
    X(CUresult, cuStreamAddCallback, (CUstream hStream, CUstreamCallback callback, \
                                      void *userData, unsigned int flags)) \
    X(CUresult, cuCtxCreate_v4, (CUcontext *pctx, void *ctxCreateParams, unsigned int flags, \
                                 CUdevice dev)) \
    X(CUresult, cuCtxGetStreamPriorityRange, (int *leastPriority, int *greatestPriority)) \
    X(CUresult, cuProfilerStart, (void)) \
    X(CUresult, cuProfilerStop, (void)) \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream)) \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, \
                                          CUstream hStream)) \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, \
                                               CUmemoryPool pool, CUstream hStream)) \
    X(CUresult, cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *poolProps)) \
    X(CUresult, cuMemPoolDestroy, (CUmemoryPool pool)) \
    X(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep)) \
    X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(CUresult, cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *pool_out, CUdevice dev)) \
    X(CUresult, cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev)) \
    X(CUresult, cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool)) \
    X(CUresult, cuMemPoolGetAccess, (CUmemAccess_flags *flags, CUmemoryPool memPool, \
                                     CUmemLocation *location)) \
    X(CUresult, cuMemPoolSetAccess, (CUmemoryPool pool, const CUmemAccessDesc *map, \
                                     size_t count)) \
    X(CUresult, cuStreamGetCtx, (CUstream hStream, CUcontext *pctx)) \
    X(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *handle, void *addr)) \
    X(unsigned long long, cudastandinSyncsDuringCapture, (void))

#define CUDADRV_DECLARE(ret, name, params) CUAPI ret name params;
CUDADRV_FUNCTIONS(CUDADRV_DECLARE)
#undef CUDADRV_DECLARE

#ifdef __cplusplus
}
#endif

#endif
