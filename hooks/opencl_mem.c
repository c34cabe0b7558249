/* OpenCL's memory objects (docs/opencl.md, "What is watched"): every
 * buffer, sub-buffer, image and pipe is the runtime's own, made by the
 * runtime's call with the program's arguments, and watched: charged to
 * its device's SPYRESHIM_LIMIT before the runtime makes it (images and
 * pipes: right after, once the runtime made them, so that its own
 * refusal wins: PoCL has no pipes), recorded
 * (shim/alloc/passthrough.c, family "opencl": statistics, leak reports
 * with their stacks, traces on the device opencl:N), and uncharged at the
 * program's last release: the program's references are counted at
 * creation, clRetainMemObject and clReleaseMemObject (the runtime's own
 * count also holds its references, e.g. for commands in flight).
 *
 * A sub-buffer, or an image made over a buffer, is its parent's memory:
 * recorded, charged nothing. Past the limit the charge makes room as for
 * any device (pressure callbacks, the collection in an embedded Python)
 * and only then refuses with the runtime's error for it,
 * CL_MEM_OBJECT_ALLOCATION_FAILURE.
 *
 * Owns nothing: the records are passthrough.c's (its leaf lock). Never
 * holds a reference of its own, never reads or writes an object's
 * contents, never calls the runtime under a lock. */
#include "opencl_internal.h"
#include "passthrough.h"

#define FAMILY SHIM_PT_OPENCL_MEM

/* `m`, the runtime's answer to a request charged `bytes` to `acct`:
 * recorded, or the charge given back when the runtime refused. Inline:
 * every buffer's last step. */
__attribute__((always_inline)) static inline cl_mem recorded(const shim_pt_account *acct,
                                                            size_t bytes, cl_mem m)
{
    if (__builtin_expect(m != NULL, 1))
        return (cl_mem)shim_passthrough_add_to(FAMILY, acct, (uintptr_t)m, bytes);
    shim_pool_give(acct->pool, bytes); /* NULL: nothing was charged */
    return NULL;
}

/* `m`, the runtime's answer to a request charged `bytes` on `d` (NULL:
 * no device known, nothing charged): recorded, or the charge given back
 * when the runtime refused. An object charged nothing (a sub-buffer) is
 * recorded on the device's uncharged account. */
static cl_mem watched(const shim_cl_dev *d, size_t bytes, cl_mem m)
{
    if (d && bytes)
        return recorded(&d->acct, bytes, m);
    if (m && d)
        shim_passthrough_add_to(FAMILY, &d->watch, (uintptr_t)m, 0);
    else if (m)
        shim_passthrough_add(FAMILY, -1, (uintptr_t)m, bytes);
    return m;
}

/* An object the runtime made before anything was charged (NULL: refused,
 * its error set): `bytes` of `ctx`'s device charged now, or, past the
 * limit, the object released again and CL_MEM_OBJECT_ALLOCATION_FAILURE
 * for the program. */
static cl_mem charged_after(shim_cl_api *a, cl_context ctx, cl_mem m, size_t bytes,
                            cl_int *errcode_ret)
{
    if (!m)
        return NULL;
    const shim_cl_dev *d = shim_cl_device_of(a, ctx);
    if (d && bytes && shim_cl_charge(d, bytes) != CL_SUCCESS) {
        a->release_mem_object(m);
        shim_cl_set_err(errcode_ret, CL_MEM_OBJECT_ALLOCATION_FAILURE);
        return NULL;
    }
    return watched(d, bytes, m);
}

/* Whether the runtime refuses a buffer for its flags, size or host
 * pointer alone, the errors the specification gives clCreateBuffer
 * without looking at any object (CL_INVALID_VALUE: flags that exclude
 * each other; CL_INVALID_BUFFER_SIZE: 0; CL_INVALID_HOST_PTR: a pointer
 * without CL_MEM_USE_HOST_PTR or CL_MEM_COPY_HOST_PTR, or one of them
 * without a pointer), or may (a flag the shim does not know: a vendor's,
 * or one the specification keeps for images). Such a request goes to the
 * runtime before the limit, so that the program gets the runtime's
 * error, whatever the limit would say. */
/* The common request, at a glance: read-write, sized, no host memory. */
static inline bool args_plain(cl_mem_flags flags, size_t size, const void *host_ptr)
{
    return flags == CL_MEM_READ_WRITE && size && !host_ptr;
}

static inline bool args_refused(cl_mem_flags flags, size_t size, const void *host_ptr)
{
    const cl_mem_flags known = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY |
                               CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR |
                               CL_MEM_COPY_HOST_PTR | CL_MEM_HOST_WRITE_ONLY |
                               CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;
    if (__builtin_expect(args_plain(flags, size, host_ptr), 1))
        return false;
    if (size == 0 || (flags & ~known))
        return true;
    int access = !!(flags & CL_MEM_READ_WRITE) + !!(flags & CL_MEM_WRITE_ONLY) +
                 !!(flags & CL_MEM_READ_ONLY);
    int host = !!(flags & CL_MEM_HOST_WRITE_ONLY) + !!(flags & CL_MEM_HOST_READ_ONLY) +
               !!(flags & CL_MEM_HOST_NO_ACCESS);
    if (access > 1 || host > 1 ||
        ((flags & CL_MEM_USE_HOST_PTR) &&
         (flags & (CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR))))
        return true;
    bool wants_ptr = (flags & (CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR)) != 0;
    return wants_ptr != (host_ptr != NULL);
}

/* clCreateBuffer, and clCreateBufferWithProperties where `with_props`:
 * every request the way the specification orders its answers. */
__attribute__((always_inline)) static inline cl_mem create_buffer_any(
    bool with_props, cl_context ctx, const cl_mem_properties *props, cl_mem_flags flags,
    size_t size, void *host_ptr, cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a || (with_props && !a->create_buffer_with_properties)) {
        shim_cl_set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
#define REAL_CREATE()                                                                      \
    (with_props ? a->create_buffer_with_properties(ctx, props, flags, size, host_ptr,      \
                                                   errcode_ret)                            \
                : a->create_buffer(ctx, flags, size, host_ptr, errcode_ret))
    const shim_cl_dev *d = NULL;
    cl_int err = CL_SUCCESS;
    if (args_refused(flags, size, host_ptr) ||
        ((d = shim_cl_device_of(a, ctx)) &&
         (err = shim_cl_charge_buffer(d, size)) == SHIM_CL_RUNTIME_FIRST))
        return charged_after(a, ctx, REAL_CREATE(), size, errcode_ret);
    if (err != CL_SUCCESS) {
        shim_cl_set_err(errcode_ret, err);
        return NULL;
    }
    return watched(d, size, REAL_CREATE());
#undef REAL_CREATE
}

/* create_buffer_any out of line, one per entry point: the common
 * request's path (create_buffer) jumps to it with its arguments as they
 * came. */
__attribute__((noinline)) static cl_mem create_buffer_slow(cl_context ctx, cl_mem_flags flags,
                                                           size_t size, void *host_ptr,
                                                           cl_int *errcode_ret)
{
    return create_buffer_any(false, ctx, NULL, flags, size, host_ptr, errcode_ret);
}

__attribute__((noinline)) static cl_mem create_buffer_with_properties_slow(
    cl_context ctx, const cl_mem_properties *props, cl_mem_flags flags, size_t size,
    void *host_ptr, cl_int *errcode_ret)
{
    return create_buffer_any(true, ctx, props, flags, size, host_ptr, errcode_ret);
}

/* create_buffer_any, with the common request (args_plain, on the
 * system's only device, the limit not reached) made without a call but
 * the runtime's and the record's, and so with few registers saved: the
 * runtime's create is a few hundred instructions (docs/opencl.md,
 * "Cost"). Inline in each entry point, `with_props` a constant. */
__attribute__((always_inline)) static inline cl_mem create_buffer(
    bool with_props, cl_context ctx, const cl_mem_properties *props, cl_mem_flags flags,
    size_t size, void *host_ptr, cl_int *errcode_ret)
{
    shim_cl_api *a = shim_rt_table_peek(&shim_cl_table);
    const shim_cl_dev *d = atomic_load_explicit(&shim_cl_only_device, memory_order_acquire);
    const shim_pt_account *acct;
    /* A NULL context too: the runtime refuses it, and the charge goes back. */
    if (__builtin_expect(a && d && args_plain(flags, size, host_ptr) &&
                             (!with_props || a->create_buffer_with_properties) &&
                             (acct = shim_cl_buffer_account(d, size)) != NULL,
                         1)) {
        return recorded(acct, size,
                        with_props ? a->create_buffer_with_properties(ctx, props, flags, size,
                                                                      host_ptr, errcode_ret)
                                   : a->create_buffer(ctx, flags, size, host_ptr, errcode_ret));
    }
    return with_props ? create_buffer_with_properties_slow(ctx, props, flags, size, host_ptr,
                                                           errcode_ret)
                      : create_buffer_slow(ctx, flags, size, host_ptr, errcode_ret);
}

EXPORT cl_mem clCreateBuffer(cl_context ctx, cl_mem_flags flags, size_t size, void *host_ptr,
                             cl_int *errcode_ret)
{
    return create_buffer(false, ctx, NULL, flags, size, host_ptr, errcode_ret);
}

EXPORT cl_mem clCreateBufferWithProperties(cl_context ctx, const cl_mem_properties *props,
                                           cl_mem_flags flags, size_t size, void *host_ptr,
                                           cl_int *errcode_ret)
{
    return create_buffer(true, ctx, props, flags, size, host_ptr, errcode_ret);
}

/* The device of the context `m` was made in (NULL: unknown). */
static const shim_cl_dev *device_of_mem(shim_cl_api *a, cl_mem m)
{
    cl_context ctx = NULL;
    if (a->get_mem_object_info(m, CL_MEM_CONTEXT, sizeof ctx, &ctx, NULL) != CL_SUCCESS)
        return NULL;
    return shim_cl_device_of(a, ctx);
}

EXPORT cl_mem clCreateSubBuffer(cl_mem buffer, cl_mem_flags flags,
                                        cl_buffer_create_type type, const void *info,
                                        cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a) {
        shim_cl_set_err(errcode_ret, CL_INVALID_MEM_OBJECT);
        return NULL;
    }
    cl_mem m = a->create_sub_buffer(buffer, flags, type, info, errcode_ret);
    return m ? watched(device_of_mem(a, m), 0, m) : NULL;
}

/* An image the runtime made (NULL: refused, its error set): its size
 * charged now that the runtime says it (charged_after), unless it is a
 * buffer's memory (CL_MEM_ASSOCIATED_MEMOBJECT). */
static cl_mem watch_image(shim_cl_api *a, cl_context ctx, cl_mem m, cl_int *errcode_ret)
{
    if (!m)
        return NULL;
    size_t size = 0;
    cl_mem over = NULL;
    if (a->get_mem_object_info(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof over, &over, NULL) !=
            CL_SUCCESS ||
        over ||
        a->get_mem_object_info(m, CL_MEM_SIZE, sizeof size, &size, NULL) != CL_SUCCESS)
        size = 0;
    return charged_after(a, ctx, m, size, errcode_ret);
}

EXPORT cl_mem clCreateImage(cl_context ctx, cl_mem_flags flags,
                                    const cl_image_format *format, const cl_image_desc *desc,
                                    void *host_ptr, cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->create_image) {
        shim_cl_set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
    return watch_image(a, ctx, a->create_image(ctx, flags, format, desc, host_ptr, errcode_ret),
                       errcode_ret);
}

EXPORT cl_mem clCreateImageWithProperties(cl_context ctx, const cl_mem_properties *props,
                                                  cl_mem_flags flags,
                                                  const cl_image_format *format,
                                                  const cl_image_desc *desc, void *host_ptr,
                                                  cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->create_image_with_properties) {
        shim_cl_set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
    return watch_image(a, ctx,
                       a->create_image_with_properties(ctx, props, flags, format, desc,
                                                       host_ptr, errcode_ret),
                       errcode_ret);
}

EXPORT cl_mem clCreateImage2D(cl_context ctx, cl_mem_flags flags,
                                      const cl_image_format *format, size_t width,
                                      size_t height, size_t row_pitch, void *host_ptr,
                                      cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->create_image_2d) {
        shim_cl_set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
    return watch_image(a, ctx,
                       a->create_image_2d(ctx, flags, format, width, height, row_pitch,
                                          host_ptr, errcode_ret),
                       errcode_ret);
}

EXPORT cl_mem clCreateImage3D(cl_context ctx, cl_mem_flags flags,
                                      const cl_image_format *format, size_t width,
                                      size_t height, size_t depth, size_t row_pitch,
                                      size_t slice_pitch, void *host_ptr, cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->create_image_3d) {
        shim_cl_set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
    return watch_image(a, ctx,
                       a->create_image_3d(ctx, flags, format, width, height, depth, row_pitch,
                                          slice_pitch, host_ptr, errcode_ret),
                       errcode_ret);
}

/* A pipe's packets are charged (the runtime's header is its own) after
 * the runtime made it (charged_after), as an image's: a runtime may have
 * no pipes at all (PoCL answers CL_INVALID_OPERATION to every pipe), and
 * its own refusal is the program's answer, not the limit's. */
EXPORT cl_mem clCreatePipe(cl_context ctx, cl_mem_flags flags, cl_uint packet_size,
                                   cl_uint max_packets, const cl_pipe_properties *props,
                                   cl_int *errcode_ret)
{
    shim_cl_api *a = shim_cl();
    if (!a || !a->create_pipe) {
        shim_cl_set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
    size_t bytes = (size_t)packet_size * max_packets; /* 32 x 32 bits: no overflow */
    return charged_after(a, ctx,
                         a->create_pipe(ctx, flags, packet_size, max_packets, props,
                                        errcode_ret),
                         bytes, errcode_ret);
}

EXPORT cl_int clRetainMemObject(cl_mem mem)
{
    shim_cl_api *a = shim_cl();
    if (!a)
        return CL_INVALID_MEM_OBJECT;
    cl_int rc = a->retain_mem_object(mem);
    if (rc == CL_SUCCESS && mem)
        shim_passthrough_retain(FAMILY, (uintptr_t)mem);
    return rc;
}

/* Counted after the runtime's call, so that the shim's look-up overlaps
 * the runtime's work, of the record made before it (once the call
 * returns, the object may be gone and its handle another thread's new
 * object: shim_passthrough_unref_before); not when the runtime refused. */
EXPORT cl_int clReleaseMemObject(cl_mem mem)
{
    shim_cl_api *a = shim_cl();
    if (!a)
        return CL_INVALID_MEM_OBJECT;
    uint32_t before = shim_passthrough_order();
    cl_int rc = a->release_mem_object(mem);
    if (rc == CL_SUCCESS)
        shim_passthrough_unref_before(FAMILY, (uintptr_t)mem, before);
    return rc;
}
