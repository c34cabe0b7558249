/* The OpenCL API as the shim declares it (no CL header is needed to
 * build): the types, numbers and prototypes the hooks/opencl_*.c files
 * rely on, listed once. tests/programs/opencl_header_check.c includes the
 * Khronos headers, defines SHIM_OPENCL_CHECK and compiles this file
 * against them (tests/integration/test_opencl.py), so a number or a
 * parameter that differs from the real API's fails the test command. */
#ifndef SHIM_HOOKS_OPENCL_H
#define SHIM_HOOKS_OPENCL_H

#include <stddef.h>
#include <stdint.h>

/* Error numbers, flags and info names: X(name, value). */
#define SHIM_OPENCL_CONSTANTS(X)                   \
    X(CL_SUCCESS, 0)                               \
    X(CL_MEM_OBJECT_ALLOCATION_FAILURE, -4)        \
    X(CL_INVALID_VALUE, -30)                       \
    X(CL_INVALID_DEVICE, -33)                      \
    X(CL_INVALID_CONTEXT, -34)                     \
    X(CL_INVALID_MEM_OBJECT, -38)                  \
    X(CL_INVALID_COMMAND_QUEUE, -36)               \
    X(CL_INVALID_HOST_PTR, -37)                    \
    X(CL_INVALID_BUFFER_SIZE, -61)                 \
    X(CL_MEM_READ_WRITE, 1 << 0)                   \
    X(CL_MEM_WRITE_ONLY, 1 << 1)                   \
    X(CL_MEM_READ_ONLY, 1 << 2)                    \
    X(CL_MEM_USE_HOST_PTR, 1 << 3)                 \
    X(CL_MEM_ALLOC_HOST_PTR, 1 << 4)               \
    X(CL_MEM_COPY_HOST_PTR, 1 << 5)                \
    X(CL_MEM_HOST_WRITE_ONLY, 1 << 7)              \
    X(CL_MEM_HOST_READ_ONLY, 1 << 8)               \
    X(CL_MEM_HOST_NO_ACCESS, 1 << 9)               \
    X(CL_MEM_KERNEL_READ_AND_WRITE, 1 << 12)       \
    X(CL_DEVICE_TYPE_CUSTOM, 1 << 4)               \
    X(CL_DEVICE_TYPE_ALL, 0xFFFFFFFF)              \
    X(CL_DEVICE_MAX_MEM_ALLOC_SIZE, 0x1010)        \
    X(CL_DEVICE_GLOBAL_MEM_SIZE, 0x101F)           \
    X(CL_CONTEXT_DEVICES, 0x1081)                  \
    X(CL_MEM_SIZE, 0x1102)                         \
    X(CL_MEM_CONTEXT, 0x1106)                      \
    X(CL_MEM_ASSOCIATED_MEMOBJECT, 0x1107)

#ifndef SHIM_OPENCL_CHECK
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_svm_mem_flags;
typedef cl_ulong cl_properties;
typedef cl_properties cl_mem_properties;
typedef intptr_t cl_pipe_properties;
typedef cl_bitfield cl_device_type;
typedef cl_uint cl_device_info;
typedef cl_uint cl_context_info;
typedef cl_uint cl_mem_info;
typedef cl_uint cl_buffer_create_type;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_event *cl_event;
/* Read by the runtime only: the shim asks it the size it made. */
typedef struct _cl_image_format cl_image_format;
typedef struct _cl_image_desc cl_image_desc;
enum {
#define SHIM_OPENCL_ENUM_(name, value) name = (value),
    SHIM_OPENCL_CONSTANTS(SHIM_OPENCL_ENUM_)
#undef SHIM_OPENCL_ENUM_
};
#endif

typedef void (*shim_cl_svm_free_fn)(cl_command_queue, cl_uint, void *[], void *);

/* Every function the shim defines (1) or only calls (0):
 * X(field, symbol, defined, return type, parameters). The defined ones are
 * the table of intercepted entry points (opencl_routes.c hands them out;
 * opencl_mem.c, opencl_svm.c, opencl_devices.c define them). */
#define SHIM_OPENCL_API(X)                                                                    \
    X(create_buffer, clCreateBuffer, 1, cl_mem,                                               \
      (cl_context, cl_mem_flags, size_t, void *, cl_int *))                                   \
    X(create_buffer_with_properties, clCreateBufferWithProperties, 1, cl_mem,                 \
      (cl_context, const cl_mem_properties *, cl_mem_flags, size_t, void *, cl_int *))        \
    X(create_sub_buffer, clCreateSubBuffer, 1, cl_mem,                                        \
      (cl_mem, cl_mem_flags, cl_buffer_create_type, const void *, cl_int *))                  \
    X(create_image, clCreateImage, 1, cl_mem,                                                 \
      (cl_context, cl_mem_flags, const cl_image_format *, const cl_image_desc *, void *,     \
       cl_int *))                                                                             \
    X(create_image_with_properties, clCreateImageWithProperties, 1, cl_mem,                   \
      (cl_context, const cl_mem_properties *, cl_mem_flags, const cl_image_format *,          \
       const cl_image_desc *, void *, cl_int *))                                              \
    X(create_image_2d, clCreateImage2D, 1, cl_mem,                                            \
      (cl_context, cl_mem_flags, const cl_image_format *, size_t, size_t, size_t, void *,    \
       cl_int *))                                                                             \
    X(create_image_3d, clCreateImage3D, 1, cl_mem,                                            \
      (cl_context, cl_mem_flags, const cl_image_format *, size_t, size_t, size_t, size_t,    \
       size_t, void *, cl_int *))                                                             \
    X(create_pipe, clCreatePipe, 1, cl_mem,                                                   \
      (cl_context, cl_mem_flags, cl_uint, cl_uint, const cl_pipe_properties *, cl_int *))    \
    X(retain_mem_object, clRetainMemObject, 1, cl_int, (cl_mem))                              \
    X(release_mem_object, clReleaseMemObject, 1, cl_int, (cl_mem))                            \
    X(svm_alloc, clSVMAlloc, 1, void *, (cl_context, cl_svm_mem_flags, size_t, cl_uint))      \
    X(svm_free, clSVMFree, 1, void, (cl_context, void *))                                     \
    X(enqueue_svm_free, clEnqueueSVMFree, 1, cl_int,                                          \
      (cl_command_queue, cl_uint, void *[], shim_cl_svm_free_fn, void *, cl_uint,            \
       const cl_event *, cl_event *))                                                         \
    X(get_device_info, clGetDeviceInfo, 1, cl_int,                                            \
      (cl_device_id, cl_device_info, size_t, void *, size_t *))                               \
    X(get_extension_function_address, clGetExtensionFunctionAddress, 1, void *,               \
      (const char *))                                                                         \
    X(get_extension_function_address_for_platform, clGetExtensionFunctionAddressForPlatform,  \
      1, void *, (cl_platform_id, const char *))                                              \
    X(get_platform_ids, clGetPlatformIDs, 0, cl_int, (cl_uint, cl_platform_id *, cl_uint *))  \
    X(get_device_ids, clGetDeviceIDs, 0, cl_int,                                              \
      (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *))                   \
    X(get_context_info, clGetContextInfo, 0, cl_int,                                          \
      (cl_context, cl_context_info, size_t, void *, size_t *))                                \
    X(get_mem_object_info, clGetMemObjectInfo, 0, cl_int,                                     \
      (cl_mem, cl_mem_info, size_t, void *, size_t *))

#endif
