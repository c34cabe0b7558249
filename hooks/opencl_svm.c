/* OpenCL's shared virtual memory (docs/opencl.md): clSVMAlloc's pointers
 * are the runtime's, watched as its memory objects are (family
 * "opencl-svm", charged to the context's device before the runtime is
 * asked; past the limit NULL, the runtime's answer for want of memory,
 * after the pressure callbacks and the collection), and uncharged when
 * the program gives them up: clSVMFree, or clEnqueueSVMFree without a
 * callback of its own (the runtime frees them once the queue reaches
 * the command; the program may not touch them after the call). With a
 * callback the program frees them itself there, with clSVMFree.
 *
 * Owns nothing (the records are passthrough.c's). Never dereferences an
 * SVM pointer. */
#include "opencl_internal.h"
#include "passthrough.h"

#define FAMILY SHIM_PT_OPENCL_SVM

EXPORT void *clSVMAlloc(cl_context ctx, cl_svm_mem_flags flags, size_t size,
                                cl_uint alignment)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->svm_alloc)
        return NULL;
    const shim_cl_dev *d = size ? shim_cl_device_of(a, ctx) : NULL;
    if (d && shim_cl_charge(d, size) != CL_SUCCESS)
        return NULL;
    void *p = a->svm_alloc(ctx, flags, size, alignment);
    if (!p) {
        if (d)
            shim_pool_give(d->acct.pool, size);
    } else if (d) {
        shim_passthrough_add_to(FAMILY, &d->acct, (uintptr_t)p, size);
    } else {
        shim_passthrough_add(FAMILY, -1, (uintptr_t)p, size);
    }
    return p;
}

EXPORT void clSVMFree(cl_context ctx, void *ptr)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->svm_free)
        return;
    if (ptr)
        shim_passthrough_remove(FAMILY, (uintptr_t)ptr);
    a->svm_free(ctx, ptr);
}

/* Forgotten once the runtime took the command: the oldest record of each
 * pointer goes (remove's rule), so a pointer the runtime already freed and
 * handed to another thread's clSVMAlloc keeps that one's record. */
EXPORT cl_int clEnqueueSVMFree(cl_command_queue q, cl_uint n, void *ptrs[],
                                       shim_cl_svm_free_fn free_fn, void *user, cl_uint nwait,
                                       const cl_event *wait, cl_event *event)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->enqueue_svm_free)
        return CL_INVALID_COMMAND_QUEUE;
    cl_int rc = a->enqueue_svm_free(q, n, ptrs, free_fn, user, nwait, wait, event);
    if (rc == CL_SUCCESS && !free_fn && ptrs)
        for (cl_uint i = 0; i < n; i++)
            if (ptrs[i])
                shim_passthrough_remove(FAMILY, (uintptr_t)ptrs[i]);
    return rc;
}
