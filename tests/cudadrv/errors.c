/* errors: the driver's error numbers, names and messages, one table.
 *
 * No lock: constant data. Numbers and names are the real driver's (cuda.h);
 * the messages are short descriptions of our own. An unknown number gets
 * CUDA_ERROR_INVALID_VALUE and a NULL string, as with the driver. */
#include "internal.h"

#include <stddef.h>

#define ERRORS(X) \
    X(0, CUDA_SUCCESS, "no error") \
    X(1, CUDA_ERROR_INVALID_VALUE, "invalid argument") \
    X(2, CUDA_ERROR_OUT_OF_MEMORY, "out of memory") \
    X(3, CUDA_ERROR_NOT_INITIALIZED, "initialization error") \
    X(4, CUDA_ERROR_DEINITIALIZED, "driver shutting down") \
    X(5, CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using an external profiling tool") \
    X(6, CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized") \
    X(7, CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started") \
    X(8, CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped") \
    X(34, CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library") \
    X(36, CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "call requires a newer driver") \
    X(46, CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable") \
    X(100, CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected") \
    X(101, CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal") \
    X(102, CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license") \
    X(200, CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid") \
    X(201, CUDA_ERROR_INVALID_CONTEXT, "invalid device context") \
    X(202, CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current") \
    X(205, CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed") \
    X(206, CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed") \
    X(207, CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped") \
    X(208, CUDA_ERROR_ALREADY_MAPPED, "resource already mapped") \
    X(209, CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device") \
    X(210, CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired") \
    X(211, CUDA_ERROR_NOT_MAPPED, "resource not mapped") \
    X(212, CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array") \
    X(213, CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer") \
    X(214, CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered") \
    X(215, CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture") \
    X(216, CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "exclusive-thread device already in use by a different thread") \
    X(217, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
    X(218, CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed") \
    X(219, CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid OpenGL or DirectX context") \
    X(220, CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error detected during the execution") \
    X(221, CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found") \
    X(222, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain") \
    X(223, CUDA_ERROR_JIT_COMPILATION_DISABLED, "PTX JIT compilation was disabled") \
    X(224, CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "the provided execution affinity is not supported") \
    X(225, CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "the provided PTX contains unsupported call to cudaDeviceSynchronize") \
    X(226, CUDA_ERROR_CONTAINED, "an exception occurred on the device that is now contained") \
    X(300, CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid") \
    X(301, CUDA_ERROR_FILE_NOT_FOUND, "file not found") \
    X(302, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found") \
    X(303, CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed") \
    X(304, CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS") \
    X(400, CUDA_ERROR_INVALID_HANDLE, "invalid resource handle") \
    X(401, CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state") \
    X(402, CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy") \
    X(500, CUDA_ERROR_NOT_FOUND, "named symbol not found") \
    X(600, CUDA_ERROR_NOT_READY, "device not ready") \
    X(700, CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered") \
    X(701, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch") \
    X(702, CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated") \
    X(703, CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing mode") \
    X(704, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled") \
    X(705, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled") \
    X(708, CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process") \
    X(709, CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed") \
    X(710, CUDA_ERROR_ASSERT, "device-side assert triggered") \
    X(711, CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted") \
    X(712, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped") \
    X(713, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
    X(714, CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error") \
    X(715, CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered") \
    X(716, CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address") \
    X(717, CUDA_ERROR_INVALID_ADDRESS_SPACE, "operation not supported on global/shared address space") \
    X(718, CUDA_ERROR_INVALID_PC, "invalid program counter") \
    X(719, CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure") \
    X(720, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch") \
    X(721, CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory not completely freed") \
    X(800, CUDA_ERROR_NOT_PERMITTED, "operation not permitted") \
    X(801, CUDA_ERROR_NOT_SUPPORTED, "operation not supported") \
    X(802, CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized") \
    X(803, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination") \
    X(804, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "forward compatibility was attempted on non supported HW") \
    X(900, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
    X(901, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture") \
    X(906, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream") \
    X(908, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread") \
    X(909, CUDA_ERROR_TIMEOUT, "wait operation timed out") \
    X(999, CUDA_ERROR_UNKNOWN, "unknown error")

static const struct {
    int code;
    const char *name;
    const char *text;
} table[] = {
#define ROW(code, name, text) { code, #name, text },
    ERRORS(ROW)
#undef ROW
};

static CUresult lookup(CUresult error, const char **str, bool name)
{
    if (!str)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].code == error) {
            *str = name ? table[i].name : table[i].text;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* Both work before cuInit, as the real ones do. */
CUresult cuGetErrorString(CUresult error, const char **str)
{
    return lookup(error, str, false);
}

CUresult cuGetErrorName(CUresult error, const char **str)
{
    return lookup(error, str, true);
}
