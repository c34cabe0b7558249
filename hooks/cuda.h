/* The CUDA driver API as the shim declares it (no toolkit header is needed
 * to build), and what the two CUDA routes (cuda_runtime.c, cuda_driver.c)
 * and the dlsym interposition (dlsym.c) tell each other.
 *
 * Every type, constant, struct size and prototype the shim relies on is
 * listed here once, as data: tests/programs/cuda_header_check.c includes
 * the toolkit's cuda.h, defines SHIM_CUDA_CHECK and compiles this file
 * against it (tests/integration/test_cuda_toolkit.py), so a number or a
 * parameter that differs from the real driver's fails the test command. */
#ifndef SHIM_HOOKS_CUDA_H
#define SHIM_HOOKS_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Error numbers, attribute numbers and flags: X(name, value). */
#define SHIM_CUDA_CONSTANTS(X)                              \
    X(CUDA_SUCCESS, 0)                                      \
    X(CUDA_ERROR_INVALID_VALUE, 1)                          \
    X(CUDA_ERROR_OUT_OF_MEMORY, 2)                          \
    X(CUDA_ERROR_NOT_INITIALIZED, 3)                        \
    X(CUDA_ERROR_DEINITIALIZED, 4)                          \
    X(CUDA_ERROR_INVALID_CONTEXT, 201)                      \
    X(CUDA_ERROR_NOT_FOUND, 500)                            \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, 709)                 \
    X(CUDA_ERROR_NOT_SUPPORTED, 801)                        \
    X(CUDA_ERROR_ILLEGAL_STATE, 401)                        \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, 900)           \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, 901)           \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, 904)              \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, 906)              \
    X(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 5)              \
    X(CU_STREAM_CAPTURE_MODE_GLOBAL, 0)                     \
    X(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, 1)               \
    X(CU_STREAM_CAPTURE_MODE_RELAXED, 2)                    \
    X(CU_STREAM_CAPTURE_STATUS_NONE, 0)                     \
    X(CU_POINTER_ATTRIBUTE_CONTEXT, 1)                      \
    X(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 2)                  \
    X(CU_POINTER_ATTRIBUTE_BUFFER_ID, 7)                    \
    X(CU_POINTER_ATTRIBUTE_IS_MANAGED, 8)                   \
    X(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 9)               \
    X(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 11)            \
    X(CU_POINTER_ATTRIBUTE_RANGE_SIZE, 12)                  \
    X(CU_GET_PROC_ADDRESS_DEFAULT, 0)                       \
    X(CU_GET_PROC_ADDRESS_LEGACY_STREAM, 1)                 \
    X(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 2)     \
    X(CU_IPC_HANDLE_SIZE, 64)                               \
    X(CU_MEM_LOCATION_TYPE_DEVICE, 1)                       \
    X(CU_MEM_ACCESS_FLAGS_PROT_READWRITE, 3)                \
    X(CUDA_ERROR_INVALID_DEVICE, 101)

/* Sizes of the types the shim passes by value or through pointers. */
#define SHIM_CUDA_SIZES(X) X(CUipcMemHandle, 64) X(CUdeviceptr, 8) X(CUresult, 4) X(CUdevice, 4) \
    X(CUmemLocation, 8) X(CUmemAllocationProp, 32)

/* cuda.h's scalar and handle types: X(name, the type it is). Its enums
 * have no negative values, so GCC gives them unsigned int. */
#define SHIM_CUDA_TYPES(X)                                 \
    X(CUresult, unsigned)                                  \
    X(CUpointer_attribute, unsigned)                       \
    X(CUdriverProcAddressQueryResult, unsigned)            \
    X(CUstreamCaptureMode, unsigned)                       \
    X(CUstreamCaptureStatus, unsigned)                     \
    X(CUdevice, int)                                       \
    X(CUdeviceptr, unsigned long long)                     \
    X(cuuint64_t, uint64_t)                                \
    X(CUmemGenericAllocationHandle, unsigned long long)    \
    X(CUcontext, struct CUctx_st *)                        \
    X(CUstream, struct CUstream_st *)                      \
    X(CUmemPool_attribute, unsigned)                       \
    X(CUmemoryPool, struct CUmemPoolHandle_st *)           \
    X(CUgraph, struct CUgraph_st *)                        \
    X(CUmemAccess_flags, unsigned)                         \
    X(CUexecAffinityParam, struct CUexecAffinityParam_st)  \
    X(CUctxCreateParams, struct CUctxCreateParams_st)

#ifndef SHIM_CUDA_CHECK
#define SHIM_CUDA_TYPEDEF_(name, type) typedef type name;
SHIM_CUDA_TYPES(SHIM_CUDA_TYPEDEF_)
#undef SHIM_CUDA_TYPEDEF_
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;
/* cuMemCreate's properties: the shim reads location (which device). */
typedef struct CUmemLocation_st {
    unsigned type; /* CUmemLocationType */
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp_st {
    unsigned type;                 /* CUmemAllocationType */
    unsigned requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
#define SHIM_CUDA_ENUM_(name, value) name = value,
enum { SHIM_CUDA_CONSTANTS(SHIM_CUDA_ENUM_) };
#undef SHIM_CUDA_ENUM_
#endif

/* The driver functions the shim uses: X(field, symbol, defined, return,
 * parameters). Each is resolved at run time (the real one); `defined` 1:
 * the shim also defines and exports it (hooks/cuda_driver.c: served, or
 * watched for context teardown), with the driver's own prototype. */
#define SHIM_CUDA_DRIVER(X)                                                                      \
    X(mem_alloc, cuMemAlloc_v2, 1, CUresult, (CUdeviceptr *, size_t))                            \
    X(mem_free, cuMemFree_v2, 1, CUresult, (CUdeviceptr))                                        \
    X(mem_get_info, cuMemGetInfo_v2, 1, CUresult, (size_t *, size_t *))                          \
    X(mem_alloc_pitch, cuMemAllocPitch_v2, 1, CUresult,                                          \
      (CUdeviceptr *, size_t *, size_t, size_t, unsigned))                                       \
    X(mem_get_address_range, cuMemGetAddressRange_v2, 1, CUresult,                               \
      (CUdeviceptr *, size_t *, CUdeviceptr))                                                    \
    X(ipc_get_mem_handle, cuIpcGetMemHandle, 1, CUresult, (CUipcMemHandle *, CUdeviceptr))       \
    X(get_proc_address, cuGetProcAddress, 1, CUresult, (const char *, void **, int, cuuint64_t)) \
    X(get_proc_address_v2, cuGetProcAddress_v2, 1, CUresult,                                     \
      (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))                \
    X(ctx_get_device, cuCtxGetDevice, 0, CUresult, (CUdevice *))                                 \
    X(ctx_get_current, cuCtxGetCurrent, 0, CUresult, (CUcontext *))                              \
    X(ctx_synchronize, cuCtxSynchronize, 0, CUresult, (void))                                    \
    X(ctx_push, cuCtxPushCurrent_v2, 0, CUresult, (CUcontext))                                   \
    X(ctx_pop, cuCtxPopCurrent_v2, 0, CUresult, (CUcontext *))                                   \
    X(ctx_destroy, cuCtxDestroy_v2, 1, CUresult, (CUcontext))                                    \
    X(ctx_create_v1, cuCtxCreate, 1, CUresult, (CUcontext *, unsigned, CUdevice))                \
    X(ctx_create, cuCtxCreate_v2, 1, CUresult, (CUcontext *, unsigned, CUdevice))                \
    X(ctx_create_v3, cuCtxCreate_v3, 1, CUresult,                                                \
      (CUcontext *, CUexecAffinityParam *, int, unsigned, CUdevice))                             \
    X(ctx_create_v4, cuCtxCreate_v4, 1, CUresult,                                                \
      (CUcontext *, CUctxCreateParams *, unsigned, CUdevice))                                    \
    X(stream_get_ctx, cuStreamGetCtx, 0, CUresult, (CUstream, CUcontext *))                      \
    X(device_get_default_mem_pool, cuDeviceGetDefaultMemPool, 0, CUresult,                       \
      (CUmemoryPool *, CUdevice))                                                                \
    X(device_get_mem_pool, cuDeviceGetMemPool, 0, CUresult, (CUmemoryPool *, CUdevice))          \
    X(mem_pool_get_access, cuMemPoolGetAccess, 0, CUresult,                                      \
      (CUmemAccess_flags *, CUmemoryPool, CUmemLocation *))                                      \
    X(ctx_destroy_v1, cuCtxDestroy, 1, CUresult, (CUcontext))                                    \
    X(primary_ctx_retain, cuDevicePrimaryCtxRetain, 1, CUresult, (CUcontext *, CUdevice))        \
    X(primary_ctx_release, cuDevicePrimaryCtxRelease_v2, 1, CUresult, (CUdevice))                \
    X(primary_ctx_release_v1, cuDevicePrimaryCtxRelease, 1, CUresult, (CUdevice))                \
    X(primary_ctx_reset, cuDevicePrimaryCtxReset_v2, 1, CUresult, (CUdevice))                    \
    X(primary_ctx_reset_v1, cuDevicePrimaryCtxReset, 1, CUresult, (CUdevice))                    \
    X(primary_ctx_get_state, cuDevicePrimaryCtxGetState, 0, CUresult,                            \
      (CUdevice, unsigned *, int *))                                                             \
    X(pointer_get_attribute, cuPointerGetAttribute, 1, CUresult,                                 \
      (void *, CUpointer_attribute, CUdeviceptr))                                                \
    X(pointer_get_attributes, cuPointerGetAttributes, 1, CUresult,                               \
      (unsigned, CUpointer_attribute *, void **, CUdeviceptr))                                   \
    X(mem_free_async, cuMemFreeAsync, 1, CUresult, (CUdeviceptr, CUstream))                      \
    X(mem_free_async_ptsz, cuMemFreeAsync_ptsz, 1, CUresult, (CUdeviceptr, CUstream)) \
    X(mem_alloc_managed, cuMemAllocManaged, 1, CUresult, (CUdeviceptr *, size_t, unsigned))   \
    X(mem_host_alloc, cuMemHostAlloc, 1, CUresult, (void **, size_t, unsigned))                \
    X(mem_alloc_host, cuMemAllocHost_v2, 1, CUresult, (void **, size_t))                       \
    X(mem_alloc_host_v1, cuMemAllocHost, 1, CUresult, (void **, unsigned))                     \
    X(mem_free_host, cuMemFreeHost, 1, CUresult, (void *))                                     \
    X(mem_host_register, cuMemHostRegister_v2, 1, CUresult, (void *, size_t, unsigned))        \
    X(mem_host_register_v1, cuMemHostRegister, 1, CUresult, (void *, size_t, unsigned))        \
    X(mem_host_unregister, cuMemHostUnregister, 1, CUresult, (void *))                         \
    X(mem_create, cuMemCreate, 1, CUresult,                                                      \
      (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(mem_release, cuMemRelease, 1, CUresult, (CUmemGenericAllocationHandle))                    \
    X(mem_map, cuMemMap, 1, CUresult,                                                            \
      (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long))           \
    X(mem_unmap, cuMemUnmap, 1, CUresult, (CUdeviceptr, size_t))                                 \
    X(mem_retain_allocation_handle, cuMemRetainAllocationHandle, 1, CUresult,                    \
      (CUmemGenericAllocationHandle *, void *))                                                  \
    X(exchange_capture_mode, cuThreadExchangeStreamCaptureMode, 0, CUresult, (CUstreamCaptureMode *)) \
    X(stream_get_capture_info, cuStreamGetCaptureInfo, 0, CUresult,                              \
      (CUstream, CUstreamCaptureStatus *, cuuint64_t *))                                         \
    X(mem_alloc_async, cuMemAllocAsync, 1, CUresult, (CUdeviceptr *, size_t, CUstream))           \
    X(mem_alloc_async_ptsz, cuMemAllocAsync_ptsz, 1, CUresult, (CUdeviceptr *, size_t, CUstream)) \
    X(mem_alloc_from_pool_async, cuMemAllocFromPoolAsync, 1, CUresult,                           \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                           \
    X(mem_alloc_from_pool_async_ptsz, cuMemAllocFromPoolAsync_ptsz, 1, CUresult,                 \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                           \
    X(mem_pool_trim_to, cuMemPoolTrimTo, 1, CUresult, (CUmemoryPool, size_t))                   \
    X(mem_pool_get_attribute, cuMemPoolGetAttribute, 0, CUresult,                                \
      (CUmemoryPool, CUmemPool_attribute, void *))                                               \
    X(stream_begin_capture_v1, cuStreamBeginCapture, 1, CUresult, (CUstream))                    \
    X(stream_begin_capture_v1_ptsz, cuStreamBeginCapture_ptsz, 1, CUresult, (CUstream))          \
    X(stream_begin_capture, cuStreamBeginCapture_v2, 1, CUresult, (CUstream, CUstreamCaptureMode)) \
    X(stream_begin_capture_ptsz, cuStreamBeginCapture_v2_ptsz, 1, CUresult,                     \
      (CUstream, CUstreamCaptureMode))                                                           \
    X(stream_end_capture, cuStreamEndCapture, 1, CUresult, (CUstream, CUgraph *))                \
    X(stream_end_capture_ptsz, cuStreamEndCapture_ptsz, 1, CUresult, (CUstream, CUgraph *))

#ifndef SHIM_CUDA_CHECK
/* The CUDA runtime got the shim's cuMemAlloc_v2 through cuGetProcAddress:
 * its cudaMalloc reaches the driver route, where it is served, so the
 * runtime route passes its calls straight through. */
bool shim_cuda_driver_routed(void);

/* Stream captures the shim saw (hooks/cuda_capture.c): begun with `mode`
 * on `stream` by the calling thread; ended (whatever the driver answered
 * but "no such capture"). */
void shim_cuda_capture_begun(CUstream stream, unsigned mode);
void shim_cuda_capture_ended(CUstream stream);
/* Whether a capture seen there forbids the calling thread a wait: one it
 * began is live, or any begun in global mode. One atomic load when none
 * is live. */
bool shim_cuda_capture_seen(void);
/* Whether the calling thread may be inside a stream capture, by what the
 * shim saw and by what the driver tells (hooks/cuda_driver.c): the
 * allocator then never waits for the device, reserves or gives back a
 * region, or collects. Slow paths only. */
bool shim_cuda_capturing(void);

/* The contexts the program made or retained (hooks/cuda_contexts.c): the
 * driver lists none, and a freed block waits for the work of each context
 * of its device, served in or not. Handles only; whether one still exists
 * is the driver's answer at each wait. */
void shim_cuda_context_created(CUcontext ctx, int ordinal);
void shim_cuda_context_destroyed(CUcontext ctx);
/* Up to `max` contexts of device `ordinal` into `out`; how many. */
size_t shim_cuda_contexts_of(int ordinal, uintptr_t *out, size_t max);

#endif

#endif
