/* Compiles the shim's own OpenCL declarations (hooks/opencl.h) against the
 * Khronos headers (Debian's opencl-c-headers): every constant and
 * prototype the shim defines or calls must be the real API's. Never part
 * of the library's build: tests/integration/test_opencl.py compiles it
 * (-fsyntax-only, -iquote hooks) where CL/cl.h is installed. */
#define CL_TARGET_OPENCL_VERSION 300
/* The shim also serves the 1.x names programs still call. */
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS 1
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS 1
#include <CL/cl.h>

#define SHIM_OPENCL_CHECK 1
#include "opencl.h"

#define CONSTANT(name, value) _Static_assert((name) == (value), #name " is not " #value " in CL/cl.h");
SHIM_OPENCL_CONSTANTS(CONSTANT)

#define PROTOTYPE(f, sym, defined, ret, params)                                   \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&sym), ret(*) params), \
                   #sym "'s prototype is not CL/cl.h's");
SHIM_OPENCL_API(PROTOTYPE)

/* The region clCreateSubBuffer is given, as the shim fills it. */
_Static_assert(sizeof(cl_buffer_region) == 2 * sizeof(size_t), "cl_buffer_region's size");
_Static_assert(__builtin_offsetof(cl_buffer_region, size) == sizeof(size_t),
               "cl_buffer_region's size field");

int shim_opencl_header_check;
