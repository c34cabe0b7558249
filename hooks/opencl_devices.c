/* OpenCL's devices as the shim counts them (docs/opencl.md, "The
 * limit"): one device of the allocator, opencl:N, per cl_device_id that
 * memory is made on, whatever the number of contexts the program makes:
 * SPYRESHIM_LIMIT and what clGetDeviceInfo answers are the device's. A
 * context is only asked for its first device (CL_CONTEXT_DEVICES), and
 * not even that where the system has one device (counted once): the shim
 * keeps no record of contexts and holds no reference on any.
 *
 * Owns: the table of cl_device_ids seen, append-only (a slot claimed by
 * one compare-and-swap, never freed: cl_device_ids of root devices live
 * as long as the process), each with what the runtime says of its memory.
 * No lock. Never serves memory from regions: the allocator's device here
 * is an account (shim/alloc/charge.c) and a name. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "opencl_internal.h"
#include "options.h"
#include "passthrough.h"

typedef struct cl_dev {
    _Atomic(cl_device_id) id;
    _Atomic(const shim_cl_dev *) pub; /* malloc'd, set once (set_up) */
} cl_dev;

static cl_dev devs[SHIM_MAX_DEVICES];

/* The device a charge is for, on the thread charging: what the allocator's
 * memory query (the out-of-memory report) is about. */
static __thread int tls_charging = -1;

/* The allocator's view of a device it never reserves a region on. */
static int no_region(void **ptr, size_t size)
{
    (void)ptr;
    (void)size;
    return CL_MEM_OBJECT_ALLOCATION_FAILURE;
}

static int no_free(void *ptr)
{
    (void)ptr;
    return CL_INVALID_MEM_OBJECT;
}

/* The device's size; the runtime tells no free memory (PoCL's memory is
 * had at first use), so none of it is said to be taken. */
static int ocl_mem_info(size_t *free_out, size_t *total_out)
{
    int i = tls_charging;
    if (i < 0)
        return CL_INVALID_DEVICE;
    const shim_cl_dev *d = atomic_load_explicit(&devs[i].pub, memory_order_acquire);
    if (!d)
        return CL_INVALID_DEVICE;
    *total_out = *free_out = d->global_mem;
    return 0;
}

/* No device is current on a thread in OpenCL: set only so that devices
 * are named by their ordinal (opencl:0); never asked. */
static int no_current(int *ordinal, uintptr_t *context)
{
    (void)ordinal;
    (void)context;
    return CL_INVALID_CONTEXT;
}

static const shim_runtime opencl_rt = {
    .name = "opencl",
    .err_invalid = CL_INVALID_VALUE,
    .err_oom = CL_MEM_OBJECT_ALLOCATION_FAILURE,
    .alignment = 256,
    .real_malloc = no_region,
    .real_free = no_free,
    .real_mem_info = ocl_mem_info,
    .current_device = no_current,
};

/* Slot `i`, claimed for `id`: what the runtime says of it and its
 * device, published once whole. Two threads may both get here for one
 * slot: they ask the same, and the first to publish is kept (the other's
 * copy freed), so that what the create path reads never changes. */
static const shim_cl_dev *set_up(shim_cl_api *a, int i, cl_device_id id)
{
    cl_ulong global = 0, max = 0;
    if (a->get_device_info(id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL) !=
            CL_SUCCESS ||
        a->get_device_info(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max, &max, NULL) !=
            CL_SUCCESS)
        return NULL;
    shim_cl_dev *mine = malloc(sizeof *mine);
    if (!mine)
        return NULL;
    shim_device *d = shim_device_get_ordinal(&opencl_rt, i);
    if (!d) {
        free(mine);
        return NULL;
    }
    shim_pt_account acct = shim_passthrough_account(d);
    *mine = (shim_cl_dev){.dev = d, .acct = acct,
                          .watch = shim_passthrough_account_of(acct.ordinal, acct.index, NULL),
                          .global_mem = (size_t)global, .max_alloc = (size_t)max};
    const shim_cl_dev *first = NULL;
    if (atomic_compare_exchange_strong_explicit(&devs[i].pub, &first, mine, memory_order_acq_rel,
                                                memory_order_acquire))
        return mine;
    free(mine);
    return first;
}

static const shim_cl_dev *device_of_id(shim_cl_api *a, cl_device_id id)
{
    for (int i = 0; i < SHIM_MAX_DEVICES; i++) {
        cl_device_id cur = atomic_load_explicit(&devs[i].id, memory_order_acquire);
        if (!cur && atomic_compare_exchange_strong(&devs[i].id, &cur, id))
            return set_up(a, i, id);
        if (cur == id) {
            const shim_cl_dev *d = atomic_load_explicit(&devs[i].pub, memory_order_acquire);
            return d ? d : set_up(a, i, id);
        }
    }
    static _Atomic bool warned;
    if (!atomic_exchange(&warned, true))
        shim_warn("opencl: more than %d devices: the memory of the others is watched, not "
                  "limited", SHIM_MAX_DEVICES);
    return NULL;
}

/* The system's only device, where it has one (PoCL's CPU here): then
 * every context's memory is its (a sub-device's too: the same memory),
 * known without asking the runtime at each creation (read inline by
 * shim_cl_device_of). */
_Atomic(const shim_cl_dev *) shim_cl_only_device;
static _Atomic int devices_in_system = -1; /* -1: not counted yet */

/* The devices of every platform (CL_DEVICE_TYPE_ALL leaves custom ones
 * out): 1 with it in *only, or how many there are. */
static int count_devices(shim_cl_api *a, cl_device_id *only)
{
    cl_platform_id plats[16];
    cl_uint np = 0;
    if (!a->get_platform_ids || !a->get_device_ids ||
        a->get_platform_ids(16, plats, &np) != CL_SUCCESS || np > 16)
        return 0;
    int n = 0;
    static const cl_device_type types[] = {CL_DEVICE_TYPE_ALL, CL_DEVICE_TYPE_CUSTOM};
    for (cl_uint p = 0; p < np; p++) {
        for (size_t t = 0; t < 2; t++) {
            cl_uint k = 0;
            if (a->get_device_ids(plats[p], types[t], 1, only, &k) == CL_SUCCESS)
                n += (int)k;
        }
    }
    return n;
}

const shim_cl_dev *shim_cl_device_lookup(shim_cl_api *a, cl_context ctx)
{
    if (!ctx)
        return NULL;
    const shim_cl_dev *one = atomic_load_explicit(&shim_cl_only_device, memory_order_acquire);
    if (one)
        return one;
    if (atomic_load_explicit(&devices_in_system, memory_order_relaxed) < 0) {
        cl_device_id id = NULL;
        int n = count_devices(a, &id);
        one = n == 1 ? device_of_id(a, id) : NULL;
        if (one)
            atomic_store_explicit(&shim_cl_only_device, one, memory_order_release);
        atomic_store_explicit(&devices_in_system, n, memory_order_relaxed);
        if (one)
            return one;
    }
    cl_device_id ids[8];
    size_t len = 0;
    cl_int rc = a->get_context_info(ctx, CL_CONTEXT_DEVICES, sizeof ids, ids, &len);
    if (rc == CL_SUCCESS)
        return len >= sizeof ids[0] ? device_of_id(a, ids[0]) : NULL;
    /* More devices than that: the list's size, then the list. */
    if (a->get_context_info(ctx, CL_CONTEXT_DEVICES, 0, NULL, &len) != CL_SUCCESS ||
        len < sizeof ids[0])
        return NULL;
    cl_device_id *all = malloc(len);
    const shim_cl_dev *d = NULL;
    if (all && a->get_context_info(ctx, CL_CONTEXT_DEVICES, len, all, NULL) == CL_SUCCESS)
        d = device_of_id(a, all[0]);
    free(all);
    return d;
}

cl_int shim_cl_charge_slow(const shim_cl_dev *d, size_t bytes)
{
    /* Restored, not cleared: a pressure callback may make memory itself. */
    int outer = tls_charging;
    tls_charging = d->acct.ordinal;
    int rc = shim_passthrough_charge(d->dev, bytes);
    tls_charging = outer;
    return rc == 0 ? CL_SUCCESS : CL_MEM_OBJECT_ALLOCATION_FAILURE;
}

/* The device's memory as the shim lets the program have it: the size and
 * the largest buffer capped to SPYRESHIM_LIMIT (per device). */
EXPORT cl_int clGetDeviceInfo(cl_device_id dev, cl_device_info param, size_t size,
                                      void *value, size_t *size_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a)
        return CL_INVALID_DEVICE;
    cl_int rc = a->get_device_info(dev, param, size, value, size_ret);
    size_t limit = shim_opts()->limit;
    if (rc == CL_SUCCESS && limit && value && size >= sizeof(cl_ulong) &&
        (param == CL_DEVICE_GLOBAL_MEM_SIZE || param == CL_DEVICE_MAX_MEM_ALLOC_SIZE)) {
        cl_ulong v;
        memcpy(&v, value, sizeof v);
        if (v > limit) {
            v = limit;
            memcpy(value, &v, sizeof v);
        }
    }
    return rc;
}
