/* The cuGetProcAddress table: X(name, version, function), one row per ABI
 * version of a driver symbol. A request for `name` at cudaVersion gets the
 * row with the largest version not above it. `version` is the per-symbol
 * ABI version cudaTypedefs.h spells PFN_<name>_v<version>: "cuMemAlloc" at
 * 3020 and later is cuMemAlloc_v2, before it the 32-bit legacy function.
 * A NULL function marks an ABI version we do not implement, so that a
 * newer request is refused instead of answered with an older signature. */
#define CD_ENTRIES(X) \
    X(cuInit, 2000, cuInit) \
    X(cuDriverGetVersion, 2020, cuDriverGetVersion) \
    X(cuGetErrorString, 6000, cuGetErrorString) \
    X(cuGetErrorName, 6000, cuGetErrorName) \
    X(cuGetProcAddress, 11030, cuGetProcAddress) \
    X(cuGetProcAddress, 12000, cuGetProcAddress_v2) \
    X(cuDeviceGetCount, 2000, cuDeviceGetCount) \
    X(cuDeviceGet, 2000, cuDeviceGet) \
    X(cuDeviceGetName, 2000, cuDeviceGetName) \
    X(cuDeviceTotalMem, 2000, cuDeviceTotalMem) \
    X(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2) \
    X(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute) \
    X(cuDeviceGetUuid, 9020, cuDeviceGetUuid) \
    X(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2) \
    X(cuDeviceComputeCapability, 2000, cuDeviceComputeCapability) \
    X(cuDeviceGetPCIBusId, 4010, cuDeviceGetPCIBusId) \
    X(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer) \
    X(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain) \
    X(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease) \
    X(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2) \
    X(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset) \
    X(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2) \
    X(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState) \
    X(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags) \
    X(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2) \
    X(cuCtxCreate, 2000, cuCtxCreate) \
    X(cuCtxCreate, 3020, cuCtxCreate_v2) \
    X(cuCtxCreate, 11040, NULL) \
    X(cuCtxDestroy, 2000, cuCtxDestroy) \
    X(cuCtxDestroy, 4000, cuCtxDestroy_v2) \
    X(cuCtxPushCurrent, 2000, cuCtxPushCurrent) \
    X(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2) \
    X(cuCtxPopCurrent, 2000, cuCtxPopCurrent) \
    X(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2) \
    X(cuCtxSetCurrent, 4000, cuCtxSetCurrent) \
    X(cuCtxGetCurrent, 4000, cuCtxGetCurrent) \
    X(cuCtxGetDevice, 2000, cuCtxGetDevice) \
    X(cuCtxGetDevice, 13000, cuCtxGetDevice_v2) \
    X(cuCtxSynchronize, 2000, cuCtxSynchronize) \
    X(cuCtxSynchronize, 13000, cuCtxSynchronize_v2) \
    X(cuStreamCreate, 2000, cuStreamCreate) \
    X(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority) \
    X(cuStreamDestroy, 2000, cuStreamDestroy) \
    X(cuStreamDestroy, 4000, cuStreamDestroy_v2) \
    X(cuStreamSynchronize, 2000, cuStreamSynchronize) \
    X(cuStreamQuery, 2000, cuStreamQuery) \
    X(cuStreamWaitEvent, 3020, cuStreamWaitEvent) \
    X(cuEventCreate, 2000, cuEventCreate) \
    X(cuEventRecord, 2000, cuEventRecord) \
    X(cuEventSynchronize, 2000, cuEventSynchronize) \
    X(cuEventQuery, 2000, cuEventQuery) \
    X(cuEventElapsedTime, 2000, cuEventElapsedTime) \
    X(cuEventElapsedTime, 12080, cuEventElapsedTime_v2) \
    X(cuEventDestroy, 2000, cuEventDestroy) \
    X(cuEventDestroy, 4000, cuEventDestroy_v2) \
    X(cuMemAlloc, 2000, cuMemAlloc) \
    X(cuMemAlloc, 3020, cuMemAlloc_v2) \
    X(cuMemFree, 2000, cuMemFree) \
    X(cuMemFree, 3020, cuMemFree_v2) \
    X(cuMemGetInfo, 2000, cuMemGetInfo) \
    X(cuMemGetInfo, 3020, cuMemGetInfo_v2) \
    X(cuMemAllocPitch, 2000, cuMemAllocPitch) \
    X(cuMemAllocPitch, 3020, cuMemAllocPitch_v2) \
    X(cuMemGetAddressRange, 2000, cuMemGetAddressRange) \
    X(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2) \
    X(cuPointerGetAttribute, 4000, cuPointerGetAttribute) \
    X(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle) \
    X(cuMemsetD8, 2000, cuMemsetD8) \
    X(cuMemsetD8, 3020, cuMemsetD8_v2) \
    X(cuMemsetD32, 2000, cuMemsetD32) \
    X(cuMemsetD32, 3020, cuMemsetD32_v2) \
    X(cuMemsetD8Async, 3020, cuMemsetD8Async) \
    X(cuMemsetD32Async, 3020, cuMemsetD32Async) \
    X(cuMemcpy, 4000, cuMemcpy) \
    X(cuMemcpyAsync, 4000, cuMemcpyAsync) \
    X(cuMemcpyHtoD, 2000, cuMemcpyHtoD) \
    X(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2) \
    X(cuMemcpyDtoH, 2000, cuMemcpyDtoH) \
    X(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2) \
    X(cuMemcpyDtoD, 2000, cuMemcpyDtoD) \
    X(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2) \
    X(cuMemcpyHtoDAsync, 2000, cuMemcpyHtoDAsync) \
    X(cuMemcpyHtoDAsync, 3020, cuMemcpyHtoDAsync_v2) \
    X(cuMemcpyDtoHAsync, 2000, cuMemcpyDtoHAsync) \
    X(cuMemcpyDtoHAsync, 3020, cuMemcpyDtoHAsync_v2) \
    X(cuMemcpyDtoDAsync, 3000, cuMemcpyDtoDAsync) \
    X(cuMemcpyDtoDAsync, 3020, cuMemcpyDtoDAsync_v2) \
    X(cuModuleGetLoadingMode, 11070, cuModuleGetLoadingMode)
