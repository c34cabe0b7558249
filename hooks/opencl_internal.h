/* What the OpenCL files share (docs/opencl.md): the runtime's real
 * functions (opencl_routes.c) and the devices memory is charged to
 * (opencl_devices.c). Internal to hooks/. */
#ifndef SHIM_HOOKS_OPENCL_INTERNAL_H
#define SHIM_HOOKS_OPENCL_INTERNAL_H

#include <stdatomic.h>

#include "device.h"
#include "opencl.h"
#include "runtime_table.h"

/* The intercepted entry points' definitions start with it (the exports
 * test reads them from the sources). */
#define EXPORT __attribute__((visibility("default")))

/* The intercepted entry points, with the API's prototypes. */
#define SHIM_CL_DECLARE_1_(sym, ret, params) EXPORT ret sym params;
#define SHIM_CL_DECLARE_0_(sym, ret, params)
#define SHIM_CL_DECLARE_(f, sym, defined, ret, params) SHIM_CL_DECLARE_##defined##_(sym, ret, params)
SHIM_OPENCL_API(SHIM_CL_DECLARE_)
#undef SHIM_CL_DECLARE_
#undef SHIM_CL_DECLARE_0_
#undef SHIM_CL_DECLARE_1_

typedef struct shim_cl_api {
#define SHIM_CL_FIELD_(f, sym, defined, ret, params) ret(*f) params;
    SHIM_OPENCL_API(SHIM_CL_FIELD_)
#undef SHIM_CL_FIELD_
} shim_cl_api;

/* The OpenCL library's functions (the ICD loader's, or the library a
 * handle of the program's named): a runtime table (runtime_table.h). */
extern shim_rt_table shim_cl_table;
/* Every entry point's first step; NULL while no OpenCL library is loaded. */
static inline shim_cl_api *shim_cl(void)
{
    return shim_rt_table_get(&shim_cl_table);
}

/* The device memory made in `ctx` is charged to: its first device's
 * (opencl:N, one per cl_device_id, whatever the number of contexts).
 * NULL when the runtime does not know `ctx` (the call then goes to the
 * runtime for its own error) or no device can be had; never holds a
 * reference on the context. Inline where the system has one device
 * (shim_cl_only_device, set once known): a load on every create. */
extern _Atomic(shim_device *) shim_cl_only_device;
shim_device *shim_cl_device_lookup(shim_cl_api *a, cl_context ctx);
static inline shim_device *shim_cl_device_of(shim_cl_api *a, cl_context ctx)
{
    shim_device *one = atomic_load_explicit(&shim_cl_only_device, memory_order_acquire);
    return one && ctx ? one : shim_cl_device_lookup(a, ctx);
}
/* `bytes` charged to `d` before the runtime is asked (charge.c: room is
 * made, pressure callbacks and collections run, before a refusal).
 * CL_SUCCESS, or CL_MEM_OBJECT_ALLOCATION_FAILURE. */
cl_int shim_cl_charge(shim_device *d, size_t bytes);
/* A buffer's `bytes` charged to `d` (shim_cl_charge), after its size is
 * held against the largest buffer the program was told `d` has
 * (CL_DEVICE_MAX_MEM_ALLOC_SIZE, the runtime's capped to SPYRESHIM_LIMIT:
 * clGetDeviceInfo). CL_SUCCESS; CL_INVALID_BUFFER_SIZE above the cap,
 * within the runtime's own (the specification's answer for a device of
 * that size); CL_MEM_OBJECT_ALLOCATION_FAILURE past the limit; or
 * SHIM_CL_RUNTIME_FIRST (no CL error: those are 0 or below), above the
 * runtime's own: nothing charged, the runtime answers first, its error. */
#define SHIM_CL_RUNTIME_FIRST 1
cl_int shim_cl_charge_buffer(shim_device *d, size_t bytes);

static inline void shim_cl_set_err(cl_int *errcode_ret, cl_int err)
{
    if (errcode_ret)
        *errcode_ret = err;
}

#endif
