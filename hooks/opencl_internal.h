/* What the OpenCL files share (docs/opencl.md): the runtime's real
 * functions (opencl_routes.c) and the devices memory is charged to
 * (opencl_devices.c). Internal to hooks/. */
#ifndef SHIM_HOOKS_OPENCL_INTERNAL_H
#define SHIM_HOOKS_OPENCL_INTERNAL_H

#include <stdatomic.h>

#include "device.h"
#include "opencl.h"
#include "options.h"
#include "passthrough.h"
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

/* An OpenCL device as memory is charged to it (opencl:N, one per
 * cl_device_id): the allocator's device, its account at hand
 * (passthrough.h) and what the runtime says of its memory. Filled once,
 * then published (opencl_devices.c); never changes. */
typedef struct shim_cl_dev {
    shim_device *dev;
    shim_pt_account acct;   /* charged to the device's pool */
    shim_pt_account watch;  /* the same device, charged nothing */
    size_t global_mem;  /* CL_DEVICE_GLOBAL_MEM_SIZE, the runtime's */
    size_t max_alloc;   /* CL_DEVICE_MAX_MEM_ALLOC_SIZE, the runtime's */
} shim_cl_dev;

/* The device memory made in `ctx` is charged to: its first device's
 * (whatever the number of contexts). NULL when the runtime does not know
 * `ctx` (the call then goes to the runtime for its own error) or no
 * device can be had; never holds a reference on the context. Inline
 * where the system has one device (shim_cl_only_device, set once known):
 * a load on every create. */
extern _Atomic(const shim_cl_dev *) shim_cl_only_device;
const shim_cl_dev *shim_cl_device_lookup(shim_cl_api *a, cl_context ctx);
static inline const shim_cl_dev *shim_cl_device_of(shim_cl_api *a, cl_context ctx)
{
    const shim_cl_dev *one = atomic_load_explicit(&shim_cl_only_device, memory_order_acquire);
    return one && ctx ? one : shim_cl_device_lookup(a, ctx);
}
/* `bytes` charged to `d` before the runtime is asked; past the limit,
 * room is made first (charge.c: pressure callbacks, collections).
 * CL_SUCCESS, or CL_MEM_OBJECT_ALLOCATION_FAILURE. */
cl_int shim_cl_charge_slow(const shim_cl_dev *d, size_t bytes);
static inline cl_int shim_cl_charge(const shim_cl_dev *d, size_t bytes)
{
    return shim_pt_account_take(&d->acct, shim_opts()->limit, bytes) ? CL_SUCCESS
                                                                     : shim_cl_charge_slow(d, bytes);
}
/* A buffer's first steps: true when it is within both caps (below) and
 * was charged to `d` while the limit had room; false, nothing charged. */
static inline bool shim_cl_charge_fits_under(const shim_cl_dev *d, size_t limit, size_t bytes)
{
    return bytes <= d->max_alloc && (!limit || bytes <= limit) &&
           shim_pt_account_take(&d->acct, limit, bytes);
}
/* A buffer's `bytes` charged to `d` (shim_cl_charge), after its size is
 * held against the largest buffer the program was told `d` has
 * (CL_DEVICE_MAX_MEM_ALLOC_SIZE, the runtime's capped to SPYRESHIM_LIMIT:
 * clGetDeviceInfo). CL_SUCCESS; CL_INVALID_BUFFER_SIZE above the cap,
 * within the runtime's own (the specification's answer for a device of
 * that size); CL_MEM_OBJECT_ALLOCATION_FAILURE past the limit; or
 * SHIM_CL_RUNTIME_FIRST (no CL error: those are 0 or below), above the
 * runtime's own: nothing charged, the runtime answers first, its error. */
#define SHIM_CL_RUNTIME_FIRST 1
static inline cl_int shim_cl_charge_buffer(const shim_cl_dev *d, size_t bytes)
{
    size_t limit = shim_opts()->limit;
    if (shim_cl_charge_fits_under(d, limit, bytes))
        return CL_SUCCESS;
    if (bytes > d->max_alloc)
        return SHIM_CL_RUNTIME_FIRST;
    if (limit && bytes > limit)
        return CL_INVALID_BUFFER_SIZE;
    return shim_cl_charge_slow(d, bytes);
}
/* The account a buffer of `bytes` that needs nothing but the runtime's
 * answer is recorded on: without a limit, d's uncharged one (no limit to
 * hold a charge to: what is read of a pool is read under a limit only,
 * and a pair is spared an atomic add and subtract); with one, d's own,
 * charged now (shim_cl_charge_fits_under). NULL, nothing charged: for
 * shim_cl_charge_buffer to answer. Makes no call. */
static inline const shim_pt_account *shim_cl_buffer_account(const shim_cl_dev *d, size_t bytes)
{
    /* Before the options are parsed: the general way (it parses them). */
    const shim_options *o = shim_opts_if_parsed();
    if (__builtin_expect(!o, 0))
        return NULL;
    if (!o->limit)
        return &d->watch;
    return shim_cl_charge_fits_under(d, o->limit, bytes) ? &d->acct : NULL;
}

static inline void shim_cl_set_err(cl_int *errcode_ret, cl_int err)
{
    if (errcode_ret)
        *errcode_ret = err;
}

#endif
