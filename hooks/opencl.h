/* The OpenCL API as the shim declares it (no CL header is needed to
 * build): the types, numbers and prototypes hooks/opencl.c relies on,
 * listed once. tests/programs/opencl_header_check.c includes the Khronos
 * headers, defines SHIM_OPENCL_CHECK and compiles this file against them
 * (tests/integration/test_opencl.py), so a number or a parameter that
 * differs from the real API's fails the test command. */
#ifndef SHIM_HOOKS_OPENCL_H
#define SHIM_HOOKS_OPENCL_H

#include <stddef.h>
#include <stdint.h>

/* Error numbers, flags and info names: X(name, value). */
#define SHIM_OPENCL_CONSTANTS(X)                   \
    X(CL_SUCCESS, 0)                               \
    X(CL_MEM_OBJECT_ALLOCATION_FAILURE, -4)        \
    X(CL_OUT_OF_RESOURCES, -5)                     \
    X(CL_OUT_OF_HOST_MEMORY, -6)                   \
    X(CL_MISALIGNED_SUB_BUFFER_OFFSET, -13)        \
    X(CL_INVALID_VALUE, -30)                       \
    X(CL_INVALID_DEVICE, -33)                      \
    X(CL_INVALID_CONTEXT, -34)                     \
    X(CL_INVALID_HOST_PTR, -37)                    \
    X(CL_INVALID_MEM_OBJECT, -38)                  \
    X(CL_INVALID_BUFFER_SIZE, -61)                 \
    X(CL_TRUE, 1)                                  \
    X(CL_COMPLETE, 0)                              \
    X(CL_MEM_READ_WRITE, 1 << 0)                   \
    X(CL_MEM_WRITE_ONLY, 1 << 1)                   \
    X(CL_MEM_READ_ONLY, 1 << 2)                    \
    X(CL_MEM_USE_HOST_PTR, 1 << 3)                 \
    X(CL_MEM_ALLOC_HOST_PTR, 1 << 4)               \
    X(CL_MEM_COPY_HOST_PTR, 1 << 5)                \
    X(CL_MEM_HOST_WRITE_ONLY, 1 << 7)              \
    X(CL_MEM_HOST_READ_ONLY, 1 << 8)               \
    X(CL_MEM_HOST_NO_ACCESS, 1 << 9)               \
    X(CL_BUFFER_CREATE_TYPE_REGION, 0x1220)        \
    X(CL_DEVICE_MAX_MEM_ALLOC_SIZE, 0x1010)        \
    X(CL_DEVICE_MEM_BASE_ADDR_ALIGN, 0x1019)       \
    X(CL_DEVICE_GLOBAL_MEM_SIZE, 0x101F)           \
    X(CL_CONTEXT_DEVICES, 0x1081)                  \
    X(CL_MEM_FLAGS, 0x1101)                        \
    X(CL_MEM_SIZE, 0x1102)                         \
    X(CL_MEM_HOST_PTR, 0x1103)                     \
    X(CL_MEM_REFERENCE_COUNT, 0x1105)              \
    X(CL_MEM_CONTEXT, 0x1106)                      \
    X(CL_MEM_ASSOCIATED_MEMOBJECT, 0x1107)         \
    X(CL_MEM_OFFSET, 0x1108)

#ifndef SHIM_OPENCL_CHECK
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_ulong cl_bitfield;
typedef cl_bitfield cl_mem_flags;
typedef cl_bitfield cl_svm_mem_flags;
typedef cl_ulong cl_properties;
typedef cl_properties cl_mem_properties;
typedef cl_uint cl_bool;
typedef cl_uint cl_device_info;
typedef cl_uint cl_context_info;
typedef cl_uint cl_mem_info;
typedef cl_uint cl_buffer_create_type;
typedef cl_bitfield cl_command_queue_properties;
typedef cl_bitfield cl_device_type;
typedef intptr_t cl_context_properties;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_event *cl_event;
typedef struct _cl_buffer_region {
    size_t origin;
    size_t size;
} cl_buffer_region;
enum {
#define SHIM_OPENCL_ENUM_(name, value) name = (value),
    SHIM_OPENCL_CONSTANTS(SHIM_OPENCL_ENUM_)
#undef SHIM_OPENCL_ENUM_
};
#endif

typedef void (*shim_cl_destructor_fn)(cl_mem, void *);
typedef void (*shim_cl_event_fn)(cl_event, cl_int, void *);
typedef void (*shim_cl_notify_fn)(const char *, const void *, size_t, void *);

/* Every function the shim defines (1) or only calls (0):
 * X(field, symbol, defined, return type, parameters). The defined ones are
 * the table of intercepted entry points (hooks/opencl.c). */
#define SHIM_OPENCL_API(X)                                                                    \
    X(create_buffer, clCreateBuffer, 1, cl_mem,                                               \
      (cl_context, cl_mem_flags, size_t, void *, cl_int *))                                   \
    X(create_buffer_with_properties, clCreateBufferWithProperties, 1, cl_mem,                 \
      (cl_context, const cl_mem_properties *, cl_mem_flags, size_t, void *, cl_int *))        \
    X(create_sub_buffer, clCreateSubBuffer, 1, cl_mem,                                        \
      (cl_mem, cl_mem_flags, cl_buffer_create_type, const void *, cl_int *))                  \
    X(retain_mem_object, clRetainMemObject, 1, cl_int, (cl_mem))                              \
    X(release_mem_object, clReleaseMemObject, 1, cl_int, (cl_mem))                            \
    X(svm_alloc, clSVMAlloc, 1, void *, (cl_context, cl_svm_mem_flags, size_t, cl_uint))      \
    X(svm_free, clSVMFree, 1, void, (cl_context, void *))                                     \
    X(get_device_info, clGetDeviceInfo, 1, cl_int,                                            \
      (cl_device_id, cl_device_info, size_t, void *, size_t *))                               \
    X(get_mem_object_info, clGetMemObjectInfo, 1, cl_int,                                     \
      (cl_mem, cl_mem_info, size_t, void *, size_t *))                                        \
    X(create_context, clCreateContext, 1, cl_context,                                         \
      (const cl_context_properties *, cl_uint, const cl_device_id *, shim_cl_notify_fn,       \
       void *, cl_int *))                                                                     \
    X(create_context_from_type, clCreateContextFromType, 1, cl_context,                       \
      (const cl_context_properties *, cl_device_type, shim_cl_notify_fn, void *, cl_int *))   \
    X(retain_context, clRetainContext, 1, cl_int, (cl_context))                               \
    X(release_context, clReleaseContext, 1, cl_int, (cl_context))                             \
    X(release_command_queue, clReleaseCommandQueue, 0, cl_int, (cl_command_queue))            \
    X(get_extension_function_address, clGetExtensionFunctionAddress, 1, void *,               \
      (const char *))                                                                         \
    X(get_extension_function_address_for_platform, clGetExtensionFunctionAddressForPlatform,  \
      1, void *, (cl_platform_id, const char *))                                              \
    X(enqueue_copy_buffer_rect, clEnqueueCopyBufferRect, 1, cl_int,                           \
      (cl_command_queue, cl_mem, cl_mem, const size_t *, const size_t *, const size_t *,      \
       size_t, size_t, size_t, size_t, cl_uint, const cl_event *, cl_event *))                \
    X(enqueue_copy_image_to_buffer, clEnqueueCopyImageToBuffer, 1, cl_int,                   \
      (cl_command_queue, cl_mem, cl_mem, const size_t *, const size_t *, size_t, cl_uint,     \
       const cl_event *, cl_event *))                                                         \
    X(enqueue_copy_buffer_to_image, clEnqueueCopyBufferToImage, 1, cl_int,                   \
      (cl_command_queue, cl_mem, cl_mem, size_t, const size_t *, const size_t *, cl_uint,     \
       const cl_event *, cl_event *))                                                         \
    X(enqueue_copy_buffer, clEnqueueCopyBuffer, 0, cl_int,                                   \
      (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event *,   \
       cl_event *))                                                                           \
    X(enqueue_marker_with_wait_list, clEnqueueMarkerWithWaitList, 0, cl_int,                  \
      (cl_command_queue, cl_uint, const cl_event *, cl_event *))                              \
    X(set_event_callback, clSetEventCallback, 0, cl_int,                                      \
      (cl_event, cl_int, shim_cl_event_fn, void *))                                           \
    X(release_event, clReleaseEvent, 0, cl_int, (cl_event))                                   \
    X(get_context_info, clGetContextInfo, 0, cl_int,                                          \
      (cl_context, cl_context_info, size_t, void *, size_t *))                                \
    X(set_mem_object_destructor_callback, clSetMemObjectDestructorCallback, 0, cl_int,        \
      (cl_mem, shim_cl_destructor_fn, void *))                                                \
    X(create_command_queue, clCreateCommandQueue, 0, cl_command_queue,                        \
      (cl_context, cl_device_id, cl_command_queue_properties, cl_int *))                      \
    X(enqueue_write_buffer, clEnqueueWriteBuffer, 0, cl_int,                                  \
      (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint,              \
       const cl_event *, cl_event *))

#endif
