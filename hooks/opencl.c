/* OpenCL's allocation entry points (libOpenCL, the ICD loader, and through
 * it any platform: PoCL here), docs/opencl.md. Reached:
 * - at link time: the exported functions below, for programs and
 *   libraries linked with -lOpenCL (PyOpenCL's extension);
 * - by dlsym on a handle whose object defines them (ctypes users):
 *   hooks/dlsym.c asks opencl_lookup;
 * - by clGetExtensionFunctionAddress(ForPlatform), which loaders answer
 *   for core names too: the shim's function replaces a served name's.
 *
 * Served: clCreateBuffer and clCreateBufferWithProperties (no properties)
 * of device memory: the buffer the program gets is a sub-buffer of a
 * region, a large buffer the shim creates in the program's context, at the
 * offset of a block of the shim's allocator (shim/alloc, whose addresses
 * are synthetic here: a region's offsets, never host addresses); aligned
 * to CL_DEVICE_MEM_BASE_ADDR_ALIGN. The block is freed by the buffer's
 * destructor callback, which the runtime calls at its last release
 * (reference count, and after the commands that use it). COPY_HOST_PTR is
 * done with a write on a queue of the shim's. The program's sub-buffers of
 * a served buffer are made on the region (OpenCL has no sub-buffers of
 * sub-buffers) and retain the buffer; clGetMemObjectInfo answers for a
 * served buffer and its sub-buffers as for a plain buffer and its own.
 *
 * Passed through and watched (counted, charged to SPYRESHIM_LIMIT,
 * traced, in leak reports): buffers the shim cannot serve (USE_HOST_PTR,
 * ALLOC_HOST_PTR, properties, an alignment above the shim's), family
 * opencl-buffer; clSVMAlloc, family opencl-svm. clGetDeviceInfo's
 * GLOBAL_MEM_SIZE and MAX_MEM_ALLOC_SIZE are capped to SPYRESHIM_LIMIT.
 * The program's references on its contexts are counted (clCreateContext,
 * clCreateContextFromType, clRetainContext, clReleaseContext): a context
 * it no longer holds, with nothing served left in it, is torn down: the
 * shim forgets its regions and releases them and its queue, so that the
 * context goes as it would without the shim.
 *
 * Owns: the real functions (a table published with one atomic store, as
 * cuda_driver.c's), and the tables of contexts, regions and served
 * buffers under cl_mu (docs/locking.md: a leaf; no OpenCL call is made
 * under it). */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "hooks.h"
#include "log.h"
#include "mutex.h"
#include "opencl.h"
#include "options.h"
#include "passthrough.h"

#define EXPORT __attribute__((visibility("default")))

#define DECLARE_1(sym, ret, params) EXPORT ret sym params;
#define DECLARE_0(sym, ret, params)
#define DECLARE(f, sym, defined, ret, params) DECLARE_##defined(sym, ret, params)
SHIM_OPENCL_API(DECLARE)
#undef DECLARE
#undef DECLARE_0
#undef DECLARE_1

/* Flags a served buffer may have: the access and host-access ones (a
 * sub-buffer takes them), and COPY_HOST_PTR, done by a write. */
#define SERVABLE_FLAGS                                                                      \
    ((cl_mem_flags)(CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY |             \
                    CL_MEM_COPY_HOST_PTR | CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | \
                    CL_MEM_HOST_NO_ACCESS))
#define ACCESS_FLAGS ((cl_mem_flags)(CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY))
#define HOST_ACCESS_FLAGS \
    ((cl_mem_flags)(CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS))
#define HOST_PTR_FLAGS \
    ((cl_mem_flags)(CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR))
/* The shim's blocks are aligned to this; a device that needs more has its
 * buffers passed through. */
#define BLOCK_ALIGN ((size_t)256)
/* Synthetic addresses of regions: above 2^40, below 2^47 (the live
 * table's reach), each region at a 2 MiB boundary, never reused. */
#define SYNTH_BASE ((uintptr_t)1 << 40)
#define SYNTH_STEP ((uintptr_t)2 << 20)

/* ---- the real functions --------------------------------------------- */

typedef struct cl_api {
#define FIELD(f, sym, defined, ret, params) ret(*f) params;
    SHIM_OPENCL_API(FIELD)
#undef FIELD
} cl_api;

static _Atomic(cl_api *) the_api;

static void *find_in_handle(void *handle, const char *name)
{
    void *p = shim_real_dlsym(handle, name);
    return shim_is_own_address(p) ? NULL : p;
}

static void *find_in_scopes(void *unused, const char *name)
{
    (void)unused;
    return shim_resolve_real(name);
}

static void drain_at_exit(void);

static cl_api *learn(void *(*find)(void *where, const char *name), void *where)
{
    cl_api *cur = atomic_load_explicit(&the_api, memory_order_acquire);
    if (cur)
        return cur;
    cl_api *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
#define FIND(f, sym, defined, ret, params) *(void **)&a->f = find(where, #sym);
    SHIM_OPENCL_API(FIND)
#undef FIND
    if (!a->create_buffer || !a->create_sub_buffer || !a->release_mem_object ||
        !a->retain_mem_object || !a->get_context_info || !a->get_device_info ||
        !a->get_mem_object_info || !a->set_mem_object_destructor_callback ||
        !a->release_context) {
        free(a);
        return NULL;
    }
    cl_api *expected = NULL;
    if (atomic_compare_exchange_strong(&the_api, &expected, a))
        return a;
    free(a);
    return expected;
}

__attribute__((noinline)) static cl_api *learn_from_scopes(void)
{
    cl_api *a = learn(find_in_scopes, NULL);
    static _Atomic bool warned;
    if (!a && !atomic_exchange(&warned, true))
        shim_warn("opencl: the OpenCL library's functions were not found in the process");
    return a;
}

static inline cl_api *api(void)
{
    cl_api *a = atomic_load_explicit(&the_api, memory_order_acquire);
    return a ? a : learn_from_scopes();
}

/* ---- tables (cl_mu) -------------------------------------------------- */

typedef struct ctx_rec {
    cl_context ctx;
    cl_device_id dev;          /* its first device: the shim's queue's, the ordinal's */
    int ordinal;
    size_t align;              /* bytes: the largest CL_DEVICE_MEM_BASE_ADDR_ALIGN */
    size_t max_alloc;          /* the smallest CL_DEVICE_MAX_MEM_ALLOC_SIZE */
    size_t global_mem;         /* the first device's CL_DEVICE_GLOBAL_MEM_SIZE */
    cl_command_queue queue;    /* the shim's, for COPY_HOST_PTR; NULL until needed */
    unsigned regions;          /* regions of the shim in it */
    size_t region_bytes;
    unsigned live;             /* served buffers and their sub-buffers alive */
    bool pending;              /* may be done with: ctx_check_pending looks */
    int app_refs;              /* the program's references; -1: not seen made */
    struct ctx_rec *next;
} ctx_rec;

typedef struct region_rec {
    uintptr_t base;
    size_t size;
    cl_mem mem;
    ctx_rec *ctx;
    /* Sub-buffers the shim made on it and not yet destroyed: each holds a
     * reference to the region, and every command on one holds another
     * until it completes (PoCL destroys a sub-buffer at its last release
     * even while commands on it are queued; the region is what it keeps).
     * The region's reference count past 1 + nsubs is work in flight. */
    unsigned nsubs;
} region_rec;

enum buf_kind { BUF_SERVED, BUF_SUB };
typedef struct buf_rec {
    cl_mem mem;                /* what the program holds */
    struct buf_rec *next;      /* hash chain */
    enum buf_kind kind;
    uintptr_t addr;            /* BUF_SERVED: the block */
    size_t size;
    cl_mem_flags flags;        /* as the program sees them */
    ctx_rec *ctx;
    shim_device *dev;
    cl_mem parent;             /* BUF_SUB: the served buffer, retained */
    size_t origin;
    uintptr_t region;          /* the base of the region it is made on */
    struct buf_rec *next_gone; /* on the destroyed list */
} buf_rec;

static pthread_mutex_t cl_mu = PTHREAD_MUTEX_INITIALIZER;
static ctx_rec *contexts;
static region_rec *regions;    /* sorted by base */
static size_t nregions, cap_regions;
static uintptr_t next_synth = SYNTH_BASE;
#define NBUCKETS 4096
static buf_rec *buckets[NBUCKETS];
static _Atomic unsigned pending_contexts;
/* Buffers the runtime destroyed, whose blocks (or parents) are given back
 * by drain_destroyed() after the runtime's call returned: a destructor
 * callback runs inside the runtime, where a free that waits for the
 * device must not. */
static buf_rec *destroyed;
static _Atomic bool any_destroyed;
static cl_device_id ordinals[SHIM_MAX_DEVICES];

static size_t bucket_of(cl_mem m)
{
    uintptr_t x = (uintptr_t)m;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 52) & (NBUCKETS - 1);
}

/* cl_mu held. */
static buf_rec *buf_find_locked(cl_mem m)
{
    for (buf_rec *b = buckets[bucket_of(m)]; b; b = b->next)
        if (b->mem == m)
            return b;
    return NULL;
}

static bool buf_find(cl_mem m, buf_rec *out)
{
    shim_mutex_lock(&cl_mu);
    buf_rec *b = buf_find_locked(m);
    if (b)
        *out = *b;
    shim_mutex_unlock(&cl_mu);
    return b != NULL;
}

static void buf_insert(buf_rec *b)
{
    shim_mutex_lock(&cl_mu);
    size_t i = bucket_of(b->mem);
    b->next = buckets[i];
    buckets[i] = b;
    b->ctx->live++;
    shim_mutex_unlock(&cl_mu);
}

/* Removes `b` from the table; true when its context has nothing served
 * left (the count may then be the shim's alone). */
static void buf_remove(buf_rec *b)
{
    shim_mutex_lock(&cl_mu);
    for (buf_rec **p = &buckets[bucket_of(b->mem)]; *p; p = &(*p)->next) {
        if (*p == b) {
            *p = b->next;
            break;
        }
    }
    if (--b->ctx->live == 0 && !b->ctx->pending) {
        b->ctx->pending = true;
        atomic_fetch_add(&pending_contexts, 1);
    }
    shim_mutex_unlock(&cl_mu);
}

static int ordinal_of(cl_device_id dev)
{
    for (int i = 0; i < SHIM_MAX_DEVICES; i++) {
        if (ordinals[i] == dev)
            return i;
        if (!ordinals[i]) {
            ordinals[i] = dev;
            return i;
        }
    }
    return SHIM_MAX_DEVICES - 1;
}

/* The record of `ctx`, made on first use from the runtime's answers:
 * NULL when the runtime does not know the context (the caller passes the
 * call through, for the runtime's own error). */
static ctx_rec *ctx_get(cl_api *a, cl_context ctx)
{
    shim_mutex_lock(&cl_mu);
    for (ctx_rec *c = contexts; c; c = c->next) {
        if (c->ctx == ctx) {
            shim_mutex_unlock(&cl_mu);
            return c;
        }
    }
    shim_mutex_unlock(&cl_mu);
    if (!ctx)
        return NULL;
    cl_device_id devs[16];
    size_t len = 0;
    if (a->get_context_info(ctx, CL_CONTEXT_DEVICES, sizeof devs, devs, &len) != CL_SUCCESS ||
        len < sizeof devs[0])
        return NULL;
    ctx_rec *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->ctx = ctx;
    n->app_refs = -1;
    n->dev = devs[0];
    n->max_alloc = SIZE_MAX;
    for (size_t i = 0; i < len / sizeof devs[0]; i++) {
        cl_uint bits = 0;
        cl_ulong max = 0, global = 0;
        if (a->get_device_info(devs[i], CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof bits, &bits, NULL) !=
                CL_SUCCESS ||
            a->get_device_info(devs[i], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max, &max, NULL) !=
                CL_SUCCESS ||
            a->get_device_info(devs[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global,
                               NULL) != CL_SUCCESS) {
            free(n);
            return NULL;
        }
        if (bits / 8 > n->align)
            n->align = bits / 8;
        if (max < n->max_alloc)
            n->max_alloc = max;
        if (i == 0)
            n->global_mem = global;
    }
    shim_mutex_lock(&cl_mu);
    for (ctx_rec *c = contexts; c; c = c->next) {
        if (c->ctx == ctx) { /* another thread was first */
            shim_mutex_unlock(&cl_mu);
            free(n);
            return c;
        }
    }
    n->ordinal = ordinal_of(n->dev);
    n->next = contexts;
    contexts = n;
    shim_mutex_unlock(&cl_mu);
    /* Registered after the runtime set itself up (it has a context), so
     * that it runs before the runtime's own exit handlers. */
    static _Atomic bool exit_hooked;
    if (!atomic_exchange(&exit_hooked, true))
        atexit(drain_at_exit);
    return n;
}

/* The region holding synthetic address `addr`; cl_mu held. */
static region_rec *region_find_locked(uintptr_t addr)
{
    size_t lo = 0, hi = nregions;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (regions[mid].base + regions[mid].size <= addr)
            lo = mid + 1;
        else if (regions[mid].base > addr)
            hi = mid;
        else
            return &regions[mid];
    }
    return NULL;
}

/* ---- OpenCL as a shim_runtime ---------------------------------------- */

/* The context a request of this thread is served in: set by the hooks
 * around the allocator's call. */
static __thread ctx_rec *tls_ctx;

static int ocl_current_context(uintptr_t *context)
{
    if (!tls_ctx)
        return CL_INVALID_CONTEXT;
    *context = (uintptr_t)tls_ctx->ctx;
    return 0;
}

static int ocl_current_device(int *ordinal, uintptr_t *context)
{
    int rc = ocl_current_context(context);
    if (rc == 0)
        *ordinal = tls_ctx->ordinal;
    return rc;
}

/* A region: a buffer of the context, read-write, no host access flags
 * (its sub-buffers take theirs). Lack of room is the allocator's
 * out-of-memory (it tries smaller, then the pressure event); any other
 * refusal is final, as a positive number (the hook makes it the runtime's
 * negative one again). */
static int ocl_reserve(void **ptr, size_t size)
{
    ctx_rec *c = tls_ctx;
    cl_api *a = atomic_load_explicit(&the_api, memory_order_acquire);
    if (!c || !a)
        return -CL_INVALID_CONTEXT;
    if (size > c->max_alloc)
        return CL_MEM_OBJECT_ALLOCATION_FAILURE;
    cl_int err = CL_SUCCESS;
    cl_mem m = a->create_buffer(c->ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    if (!m) {
        if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_RESOURCES ||
            err == CL_OUT_OF_HOST_MEMORY || err == CL_INVALID_BUFFER_SIZE || err == CL_SUCCESS)
            return CL_MEM_OBJECT_ALLOCATION_FAILURE;
        return -err;
    }
    shim_mutex_lock(&cl_mu);
    if (nregions == cap_regions) {
        size_t cap = cap_regions ? cap_regions * 2 : 64;
        region_rec *r = realloc(regions, cap * sizeof *r);
        if (!r) {
            shim_mutex_unlock(&cl_mu);
            a->release_mem_object(m);
            return CL_MEM_OBJECT_ALLOCATION_FAILURE;
        }
        regions = r;
        cap_regions = cap;
    }
    uintptr_t base = next_synth;
    next_synth += (size + SYNTH_STEP - 1) / SYNTH_STEP * SYNTH_STEP + SYNTH_STEP;
    /* Addresses grow: appending keeps the array sorted. */
    regions[nregions++] = (region_rec){.base = base, .size = size, .mem = m, .ctx = c};
    c->regions++;
    c->region_bytes += size;
    shim_mutex_unlock(&cl_mu);
    *ptr = (void *)base;
    return 0;
}

/* Takes the region at `base` out of the table: its buffer, or NULL. */
static cl_mem region_take(uintptr_t base)
{
    shim_mutex_lock(&cl_mu);
    region_rec *r = region_find_locked(base);
    cl_mem m = NULL;
    if (r && r->base == base) {
        m = r->mem;
        r->ctx->regions--;
        r->ctx->region_bytes -= r->size;
        size_t i = (size_t)(r - regions);
        memmove(r, r + 1, (nregions - i - 1) * sizeof *r);
        nregions--;
    }
    shim_mutex_unlock(&cl_mu);
    return m;
}

static int ocl_release(void *ptr)
{
    cl_api *a = atomic_load_explicit(&the_api, memory_order_acquire);
    cl_mem m = region_take((uintptr_t)ptr);
    if (!m || !a)
        return CL_INVALID_VALUE;
    return a->release_mem_object(m);
}

/* The device's size, less what the shim's regions of the context hold
 * (the runtime tells no free memory). */
static int ocl_mem_info(size_t *free_out, size_t *total_out)
{
    ctx_rec *c = tls_ctx;
    if (!c)
        return CL_INVALID_CONTEXT;
    shim_mutex_lock(&cl_mu);
    size_t used = c->region_bytes;
    shim_mutex_unlock(&cl_mu);
    *total_out = c->global_mem;
    *free_out = c->global_mem > used ? c->global_mem - used : 0;
    return 0;
}

/* The allocator's wait for the device (its held blocks: a block freed is
 * not handed out again before it returns): until no command is in flight
 * on any region of `context`, which the regions' reference counts tell
 * (region_rec.nsubs), since the shim does not know the program's queues.
 * Polled, with no lock held, for at most SYNC_MAX_NS; past it the
 * runtime's CL_OUT_OF_RESOURCES, and the blocks stay held. */
#define SYNC_MAX_NS (5ull * 1000 * 1000 * 1000)
static int ocl_sync(int ordinal, uintptr_t context)
{
    (void)ordinal;
    cl_api *a = atomic_load_explicit(&the_api, memory_order_acquire);
    if (!a || !a->get_mem_object_info)
        return CL_INVALID_CONTEXT;
    shim_mutex_lock(&cl_mu);
    bool known = false;
    for (ctx_rec *c = contexts; c; c = c->next)
        known |= (uintptr_t)c->ctx == context;
    size_t n = 0;
    uintptr_t *bases = NULL;
    for (size_t i = 0; known && i < nregions; i++)
        n += (uintptr_t)regions[i].ctx->ctx == context;
    if (n)
        bases = malloc(n * sizeof *bases);
    n = 0;
    for (size_t i = 0; bases && i < nregions; i++)
        if ((uintptr_t)regions[i].ctx->ctx == context)
            bases[n++] = regions[i].base;
    shim_mutex_unlock(&cl_mu);
    if (!known)
        return SHIM_SYNC_GONE;
    if (n && !bases)
        return CL_OUT_OF_HOST_MEMORY;
    uint64_t start = shim_now_ns();
    long sleep_ns = 20000;
    int rc = 0;
    for (size_t i = 0; i < n;) {
        /* The region held for the look: retaining calls nothing back, so
         * it may be done under cl_mu (which keeps a release by the
         * allocator from racing it). */
        shim_mutex_lock(&cl_mu);
        region_rec *r = region_find_locked(bases[i]);
        cl_mem m = r && r->base == bases[i] ? r->mem : NULL;
        unsigned expect = m ? 2 + r->nsubs : 0;
        if (m)
            a->retain_mem_object(m);
        shim_mutex_unlock(&cl_mu);
        if (!m) { /* released since: nothing of it is in flight for us */
            i++;
            continue;
        }
        cl_uint refs = 0;
        cl_int err = a->get_mem_object_info(m, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL);
        a->release_mem_object(m);
        if (err != CL_SUCCESS) {
            rc = err;
            break;
        }
        if (refs <= expect) {
            i++;
            continue;
        }
        if (shim_now_ns() - start > SYNC_MAX_NS) {
            rc = CL_OUT_OF_RESOURCES;
            break;
        }
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 1000000)
            sleep_ns *= 2;
    }
    free(bases);
    return rc;
}

static const shim_runtime opencl_rt = {
    .name = "opencl",
    .err_invalid = CL_INVALID_VALUE,
    .err_oom = CL_MEM_OBJECT_ALLOCATION_FAILURE,
    .alignment = BLOCK_ALIGN,
    .real_malloc = ocl_reserve,
    .real_free = ocl_release,
    .real_mem_info = ocl_mem_info,
    .current_device = ocl_current_device,
    .current_context = ocl_current_context,
    .sync_device = ocl_sync,
};

/* ---- context teardown ------------------------------------------------ */

/* `c` is held by nobody but the shim: forget its regions (the allocator's
 * context teardown) and release them and the queue, so that the context
 * goes. The record goes too. */
static void ctx_teardown(cl_api *a, ctx_rec *c)
{
    /* The allocator forgets first: no block can be served from a region
     * released below. Its frees still pending may release a region on the
     * way (through ocl_release, which finds it in the table); the rest it
     * forgets, and they are released here. */
    shim_device_context_gone(&opencl_rt, (uintptr_t)c->ctx);
    shim_mutex_lock(&cl_mu);
    for (ctx_rec **p = &contexts; *p; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            break;
        }
    }
    cl_mem *mine = NULL;
    size_t n = 0;
    if (c->regions)
        mine = malloc(c->regions * sizeof *mine);
    size_t keep = 0;
    for (size_t i = 0; i < nregions; i++) {
        if (regions[i].ctx == c && mine)
            mine[n++] = regions[i].mem;
        else if (regions[i].ctx != c || !mine)
            regions[keep++] = regions[i];
    }
    nregions = keep;
    cl_command_queue q = c->queue;
    shim_mutex_unlock(&cl_mu);
    for (size_t i = 0; i < n; i++)
        a->release_mem_object(mine[i]);
    if (q && a->release_command_queue)
        a->release_command_queue(q);
    shim_debug("opencl: context %p torn down (%zu regions)", (void *)c->ctx, n);
    free(mine);
    free(c);
}

/* Looks at the contexts whose program may be done with them (its own
 * references gone, nothing served left): called after a release, with
 * no lock held. The runtime's count is no guide (PoCL keeps references of
 * its own a while): the program's are counted at clCreateContext*,
 * clRetainContext and clReleaseContext. */
static void ctx_check_pending(cl_api *a)
{
    if (!atomic_load_explicit(&pending_contexts, memory_order_relaxed))
        return;
    for (;;) {
        shim_mutex_lock(&cl_mu);
        ctx_rec *c = contexts;
        while (c && !c->pending)
            c = c->next;
        if (!c) {
            shim_mutex_unlock(&cl_mu);
            return;
        }
        c->pending = false;
        atomic_fetch_sub(&pending_contexts, 1);
        bool done = c->app_refs == 0 && c->live == 0;
        bool holds = c->regions || c->queue;
        if (done && !holds) {
            /* Nothing of the shim's in it: the record goes (the context
             * may be gone, and its address taken by another). */
            for (ctx_rec **p = &contexts; *p; p = &(*p)->next) {
                if (*p == c) {
                    *p = c->next;
                    break;
                }
            }
            shim_mutex_unlock(&cl_mu);
            free(c);
            continue;
        }
        shim_mutex_unlock(&cl_mu);
        if (done)
            ctx_teardown(a, c);
    }
}

/* The program took (+1) or dropped (-1) a reference on `ctx`. */
static void ctx_app_ref(cl_context ctx, int delta)
{
    shim_mutex_lock(&cl_mu);
    for (ctx_rec *c = contexts; c; c = c->next) {
        if (c->ctx != ctx || c->app_refs < 0)
            continue;
        if (delta > 0) {
            c->app_refs++;
        } else if (c->app_refs > 0 && --c->app_refs == 0 && !c->pending) {
            c->pending = true;
            atomic_fetch_add(&pending_contexts, 1);
        }
    }
    shim_mutex_unlock(&cl_mu);
}

/* A context the program made: its one reference. */
static cl_context ctx_made(cl_api *a, cl_context ctx)
{
    ctx_rec *c = ctx ? ctx_get(a, ctx) : NULL;
    if (c) {
        shim_mutex_lock(&cl_mu);
        c->app_refs = 1;
        shim_mutex_unlock(&cl_mu);
    }
    return ctx;
}

/* ---- buffers ------------------------------------------------------------ */

/* The region at `base`'s count of sub-buffers; cl_mu held. */
static void region_subs_locked(uintptr_t base, int delta)
{
    region_rec *r = region_find_locked(base);
    if (r)
        r->nsubs += delta;
}

/* The runtime destroys a served buffer or a sub-buffer of one: listed,
 * given back by drain_destroyed(). */
static void served_destroyed(cl_mem mem, void *arg)
{
    buf_rec *b = arg;
    shim_debug("opencl: buffer %p destroyed (%zu bytes)", (void *)mem, b->size);
    buf_remove(b);
    shim_mutex_lock(&cl_mu);
    region_subs_locked(b->region, -1);
    b->next_gone = destroyed;
    destroyed = b;
    atomic_store_explicit(&any_destroyed, true, memory_order_release);
    shim_mutex_unlock(&cl_mu);
}

/* Frees the blocks of the buffers destroyed so far (the allocator holds
 * each until the work queued on its region has run: ocl_sync) and
 * releases the served buffers the destroyed sub-buffers held. Called by
 * the hooks with no lock held, outside any runtime call. */
static void drain_destroyed(void)
{
    while (atomic_load_explicit(&any_destroyed, memory_order_acquire)) {
        shim_mutex_lock(&cl_mu);
        buf_rec *list = destroyed;
        destroyed = NULL;
        atomic_store_explicit(&any_destroyed, false, memory_order_release);
        shim_mutex_unlock(&cl_mu);
        cl_api *a = atomic_load_explicit(&the_api, memory_order_acquire);
        while (list) {
            buf_rec *b = list;
            list = b->next_gone;
            if (b->kind == BUF_SERVED)
                shim_device_free(b->dev, (void *)b->addr);
            else if (a)
                a->release_mem_object(b->parent); /* may destroy it: the loop again */
            free(b);
        }
    }
}

static void passed_destroyed(cl_mem mem, void *arg)
{
    (void)arg;
    shim_passthrough_remove(SHIM_PT_OPENCL_BUFFER, (uintptr_t)mem);
}

static shim_device *device_of(ctx_rec *c)
{
    return shim_device_get_context(&opencl_rt, c->ordinal, (uintptr_t)c->ctx);
}

static void set_err(cl_int *errcode_ret, cl_int err)
{
    if (errcode_ret)
        *errcode_ret = err;
}

/* A buffer the shim does not serve: the runtime's, charged to the
 * context's device and recorded (family opencl-buffer). */
static cl_mem pass_buffer(cl_api *a, ctx_rec *c, const cl_mem_properties *props, bool with_props,
                          cl_context ctx, cl_mem_flags flags, size_t size, void *host_ptr,
                          cl_int *errcode_ret)
{
    shim_device *d = c ? device_of(c) : NULL;
    if (d && shim_passthrough_charge(d, size) != 0) {
        set_err(errcode_ret, CL_MEM_OBJECT_ALLOCATION_FAILURE);
        return NULL;
    }
    cl_int err = CL_SUCCESS;
    cl_mem m = with_props
                   ? a->create_buffer_with_properties(ctx, props, flags, size, host_ptr, &err)
                   : a->create_buffer(ctx, flags, size, host_ptr, &err);
    set_err(errcode_ret, err);
    if (!d)
        return m;
    if (!m) {
        shim_passthrough_uncharge(d, size);
        return m;
    }
    shim_passthrough_add_charged(SHIM_PT_OPENCL_BUFFER, d, (uintptr_t)m, size);
    if (a->set_mem_object_destructor_callback(m, passed_destroyed, NULL) != CL_SUCCESS)
        shim_passthrough_remove(SHIM_PT_OPENCL_BUFFER, (uintptr_t)m);
    return m;
}

/* The shim's queue of `c`, made on first need. */
static cl_command_queue queue_of(cl_api *a, ctx_rec *c)
{
    shim_mutex_lock(&cl_mu);
    cl_command_queue q = c->queue;
    shim_mutex_unlock(&cl_mu);
    if (q || !a->create_command_queue || !a->enqueue_write_buffer)
        return q;
    cl_int err;
    q = a->create_command_queue(c->ctx, c->dev, 0, &err);
    if (!q)
        return NULL;
    shim_mutex_lock(&cl_mu);
    if (c->queue) { /* another thread's */
        shim_mutex_unlock(&cl_mu);
        a->release_command_queue(q);
        shim_mutex_lock(&cl_mu);
    } else {
        c->queue = q;
    }
    q = c->queue;
    shim_mutex_unlock(&cl_mu);
    return q;
}

static bool one_at_most(cl_mem_flags bits)
{
    return (bits & (bits - 1)) == 0;
}

/* clCreateBuffer and clCreateBufferWithProperties. */
static cl_mem create_buffer(const cl_mem_properties *props, bool with_props, cl_context ctx,
                            cl_mem_flags flags, size_t size, void *host_ptr, cl_int *errcode_ret)
{
    cl_api *a = api();
    if (!a || (with_props && !a->create_buffer_with_properties)) {
        set_err(errcode_ret, CL_INVALID_CONTEXT);
        return NULL;
    }
    drain_destroyed();
    ctx_check_pending(a);
    ctx_rec *c = ctx_get(a, ctx);
    /* Over the CL_DEVICE_MAX_MEM_ALLOC_SIZE the program was told (capped
     * to SPYRESHIM_LIMIT): the specification's answer to that. */
    size_t limit = shim_opts()->limit;
    if (c && limit && size > limit && size <= c->max_alloc) {
        set_err(errcode_ret, CL_INVALID_BUFFER_SIZE);
        return NULL;
    }
    /* What the shim cannot serve, or what is invalid (the runtime gives
     * its own error): two access flags, two host access flags, a host
     * pointer where the flags want none or none where they want one. */
    /* Past SHIM_MAX_DEVICES contexts alive the shim has no device for
     * this one: the runtime's buffers, as without the shim, said once. */
    if (c && size > 0 && !device_of(c)) {
        static _Atomic bool warned;
        if (!atomic_exchange(&warned, true))
            shim_warn("opencl: more contexts alive than the shim has devices for (%d): the "
                      "buffers of the others are the runtime's, not limited",
                      SHIM_MAX_DEVICES);
        return pass_buffer(a, NULL, props, with_props, ctx, flags, size, host_ptr, errcode_ret);
    }
    bool servable = c && size > 0 && size <= c->max_alloc && c->align <= BLOCK_ALIGN &&
                    (flags & ~SERVABLE_FLAGS) == 0 && one_at_most(flags & ACCESS_FLAGS) &&
                    one_at_most(flags & HOST_ACCESS_FLAGS) &&
                    (!with_props || !props || props[0] == 0) &&
                    ((flags & CL_MEM_COPY_HOST_PTR) ? host_ptr != NULL : host_ptr == NULL) &&
                    !shim_device_in_backend();
    if (!servable)
        return pass_buffer(a, c, props, with_props, ctx, flags, size, host_ptr, errcode_ret);

    ctx_rec *saved = tls_ctx;
    tls_ctx = c;
    void *p = NULL;
    int rc = shim_device_malloc_current(&opencl_rt, &p, size);
    tls_ctx = saved;
    if (rc != 0) {
        set_err(errcode_ret, rc > 0 ? -rc : rc);
        return NULL;
    }
    uintptr_t addr = (uintptr_t)p;
    shim_mutex_lock(&cl_mu);
    region_rec *r = region_find_locked(addr);
    cl_mem region = r ? r->mem : NULL;
    size_t offset = r ? addr - r->base : 0;
    shim_mutex_unlock(&cl_mu);
    shim_device *d = device_of(c);
    buf_rec *b = calloc(1, sizeof *b);
    cl_int err = CL_OUT_OF_HOST_MEMORY;
    cl_mem m = NULL;
    if (region && d && b) {
        cl_buffer_region reg = {.origin = offset, .size = size};
        m = a->create_sub_buffer(region, flags & (ACCESS_FLAGS | HOST_ACCESS_FLAGS),
                                 CL_BUFFER_CREATE_TYPE_REGION, &reg, &err);
    }
    if (!m) {
        /* Flags the runtime refuses, or a sub-buffer it would not make:
         * the runtime's own answer for the request. */
        if (d)
            shim_device_free(d, p);
        free(b);
        return pass_buffer(a, c, props, with_props, ctx, flags, size, host_ptr, errcode_ret);
    }
    uintptr_t base = addr - offset;
    shim_mutex_lock(&cl_mu);
    region_subs_locked(base, +1);
    shim_mutex_unlock(&cl_mu);
    if (flags & CL_MEM_COPY_HOST_PTR) {
        cl_command_queue q = queue_of(a, c);
        err = q ? a->enqueue_write_buffer(q, m, CL_TRUE, 0, size, host_ptr, 0, NULL, NULL)
                : CL_OUT_OF_RESOURCES;
        if (err != CL_SUCCESS) {
            a->release_mem_object(m);
            shim_mutex_lock(&cl_mu);
            region_subs_locked(base, -1);
            shim_mutex_unlock(&cl_mu);
            shim_device_free(d, p);
            free(b);
            set_err(errcode_ret, err);
            return NULL;
        }
    }
    *b = (buf_rec){.mem = m, .kind = BUF_SERVED, .addr = addr, .size = size,
                   .flags = flags ? flags : CL_MEM_READ_WRITE, .ctx = c, .dev = d,
                   .region = base};
    if ((b->flags & ACCESS_FLAGS) == 0)
        b->flags |= CL_MEM_READ_WRITE;
    buf_insert(b);
    if (a->set_mem_object_destructor_callback(m, served_destroyed, b) != CL_SUCCESS) {
        /* Never seen: the block then lives until the context goes. */
        shim_warn("opencl: no destructor callback on a served buffer; its block stays");
    }
    set_err(errcode_ret, CL_SUCCESS);
    return m;
}

/* ---- the intercepted entry points ------------------------------------ */

#define OPENCL_SERVED(X)                                 \
    X(clCreateBuffer)                                    \
    X(clCreateBufferWithProperties)                      \
    X(clCreateSubBuffer)                                 \
    X(clRetainMemObject)                                 \
    X(clReleaseMemObject)                                \
    X(clSVMAlloc)                                        \
    X(clSVMFree)                                         \
    X(clGetDeviceInfo)                                   \
    X(clGetMemObjectInfo)                                \
    X(clEnqueueCopyBufferRect)                           \
    X(clEnqueueCopyImageToBuffer)                        \
    X(clEnqueueCopyBufferToImage)                        \
    X(clCreateContext)                                   \
    X(clCreateContextFromType)                           \
    X(clRetainContext)                                   \
    X(clReleaseContext)                                  \
    X(clGetExtensionFunctionAddress)                     \
    X(clGetExtensionFunctionAddressForPlatform)

EXPORT cl_mem clCreateBuffer(cl_context ctx, cl_mem_flags flags, size_t size, void *host_ptr,
                             cl_int *errcode_ret)
{
    return create_buffer(NULL, false, ctx, flags, size, host_ptr, errcode_ret);
}

EXPORT cl_mem clCreateBufferWithProperties(cl_context ctx, const cl_mem_properties *props,
                                           cl_mem_flags flags, size_t size, void *host_ptr,
                                           cl_int *errcode_ret)
{
    return create_buffer(props, true, ctx, flags, size, host_ptr, errcode_ret);
}

EXPORT cl_mem clCreateSubBuffer(cl_mem buffer, cl_mem_flags flags, cl_buffer_create_type type,
                                const void *info, cl_int *errcode_ret)
{
    cl_api *a = api();
    if (!a) {
        set_err(errcode_ret, CL_INVALID_MEM_OBJECT);
        return NULL;
    }
    buf_rec parent;
    if (!buf_find(buffer, &parent))
        return a->create_sub_buffer(buffer, flags, type, info, errcode_ret);
    if (parent.kind == BUF_SUB) {
        set_err(errcode_ret, CL_INVALID_MEM_OBJECT); /* no sub-buffer of a sub-buffer */
        return NULL;
    }
    if (type != CL_BUFFER_CREATE_TYPE_REGION || !info) {
        set_err(errcode_ret, CL_INVALID_VALUE);
        return NULL;
    }
    const cl_buffer_region *want = info;
    if (want->size == 0) {
        set_err(errcode_ret, CL_INVALID_BUFFER_SIZE);
        return NULL;
    }
    if (want->origin > parent.size || want->size > parent.size - want->origin) {
        set_err(errcode_ret, CL_INVALID_VALUE);
        return NULL;
    }
    /* The flags the specification checks against the parent's. */
    cl_mem_flags pa = parent.flags;
    if ((flags & HOST_PTR_FLAGS) || (flags & ~SERVABLE_FLAGS) ||
        !one_at_most(flags & ACCESS_FLAGS) || !one_at_most(flags & HOST_ACCESS_FLAGS) ||
        ((pa & CL_MEM_WRITE_ONLY) && (flags & (CL_MEM_READ_WRITE | CL_MEM_READ_ONLY))) ||
        ((pa & CL_MEM_READ_ONLY) && (flags & (CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY))) ||
        ((pa & CL_MEM_HOST_WRITE_ONLY) && (flags & CL_MEM_HOST_READ_ONLY)) ||
        ((pa & CL_MEM_HOST_READ_ONLY) && (flags & CL_MEM_HOST_WRITE_ONLY)) ||
        ((pa & CL_MEM_HOST_NO_ACCESS) && (flags & (CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY)))) {
        set_err(errcode_ret, CL_INVALID_VALUE);
        return NULL;
    }
    cl_mem_flags eff = flags;
    if (!(eff & ACCESS_FLAGS))
        eff |= pa & ACCESS_FLAGS;
    if (!(eff & HOST_ACCESS_FLAGS))
        eff |= pa & HOST_ACCESS_FLAGS;
    if (want->origin % parent.ctx->align) {
        set_err(errcode_ret, CL_MISALIGNED_SUB_BUFFER_OFFSET);
        return NULL;
    }
    shim_mutex_lock(&cl_mu);
    region_rec *r = region_find_locked(parent.addr);
    cl_mem region = r ? r->mem : NULL;
    size_t offset = r ? parent.addr - r->base : 0;
    shim_mutex_unlock(&cl_mu);
    buf_rec *b = calloc(1, sizeof *b);
    if (!region || !b) {
        free(b);
        set_err(errcode_ret, CL_OUT_OF_HOST_MEMORY);
        return NULL;
    }
    cl_buffer_region reg = {.origin = offset + want->origin, .size = want->size};
    cl_int err = CL_SUCCESS;
    cl_mem m = a->create_sub_buffer(region, eff & (ACCESS_FLAGS | HOST_ACCESS_FLAGS), type, &reg,
                                    &err);
    if (!m) {
        free(b);
        set_err(errcode_ret, err);
        return NULL;
    }
    a->retain_mem_object(buffer); /* a sub-buffer holds its buffer */
    *b = (buf_rec){.mem = m, .kind = BUF_SUB, .size = want->size,
                   .flags = eff | (pa & CL_MEM_COPY_HOST_PTR), .ctx = parent.ctx,
                   .dev = parent.dev, .parent = buffer, .origin = want->origin,
                   .region = parent.region};
    shim_mutex_lock(&cl_mu);
    region_subs_locked(parent.region, +1);
    shim_mutex_unlock(&cl_mu);
    buf_insert(b);
    a->set_mem_object_destructor_callback(m, served_destroyed, b);
    set_err(errcode_ret, CL_SUCCESS);
    return m;
}

EXPORT cl_int clRetainMemObject(cl_mem mem)
{
    cl_api *a = api();
    return a ? a->retain_mem_object(mem) : CL_INVALID_MEM_OBJECT;
}

/* The last release runs the destructor callbacks (served_destroyed frees
 * the block): afterwards a context left with the shim's references alone
 * is torn down. */
EXPORT cl_int clReleaseMemObject(cl_mem mem)
{
    cl_api *a = api();
    if (!a)
        return CL_INVALID_MEM_OBJECT;
    cl_int rc = a->release_mem_object(mem);
    drain_destroyed();
    ctx_check_pending(a);
    return rc;
}

EXPORT void *clSVMAlloc(cl_context ctx, cl_svm_mem_flags flags, size_t size, cl_uint alignment)
{
    cl_api *a = api();
    if (!a || !a->svm_alloc)
        return NULL;
    ctx_rec *c = ctx_get(a, ctx);
    shim_device *d = c && size ? device_of(c) : NULL;
    if (d && shim_passthrough_charge(d, size) != 0)
        return NULL;
    void *p = a->svm_alloc(ctx, flags, size, alignment);
    if (d) {
        if (p)
            shim_passthrough_add_charged(SHIM_PT_OPENCL_SVM, d, (uintptr_t)p, size);
        else
            shim_passthrough_uncharge(d, size);
    }
    return p;
}

EXPORT void clSVMFree(cl_context ctx, void *ptr)
{
    cl_api *a = api();
    if (!a || !a->svm_free)
        return;
    if (ptr)
        shim_passthrough_remove(SHIM_PT_OPENCL_SVM, (uintptr_t)ptr);
    a->svm_free(ctx, ptr);
}

/* The device's memory as the shim lets the program have it. */
EXPORT cl_int clGetDeviceInfo(cl_device_id dev, cl_device_info param, size_t size, void *value,
                              size_t *size_ret)
{
    cl_api *a = api();
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

static cl_int answer(const void *v, size_t n, size_t size, void *value, size_t *size_ret)
{
    if (value) {
        if (size < n)
            return CL_INVALID_VALUE;
        memcpy(value, v, n);
    }
    if (size_ret)
        *size_ret = n;
    return CL_SUCCESS;
}

/* A served buffer answers as a buffer of its own; its sub-buffers as
 * sub-buffers of it. */
EXPORT cl_int clGetMemObjectInfo(cl_mem mem, cl_mem_info param, size_t size, void *value,
                                 size_t *size_ret)
{
    cl_api *a = api();
    if (!a)
        return CL_INVALID_MEM_OBJECT;
    buf_rec b;
    if ((param == CL_MEM_FLAGS || param == CL_MEM_HOST_PTR || param == CL_MEM_OFFSET ||
         param == CL_MEM_ASSOCIATED_MEMOBJECT) &&
        buf_find(mem, &b)) {
        switch (param) {
        case CL_MEM_FLAGS:
            return answer(&b.flags, sizeof b.flags, size, value, size_ret);
        case CL_MEM_HOST_PTR: {
            void *none = NULL;
            return answer(&none, sizeof none, size, value, size_ret);
        }
        case CL_MEM_OFFSET: {
            size_t off = b.kind == BUF_SUB ? b.origin : 0;
            return answer(&off, sizeof off, size, value, size_ret);
        }
        default: {
            cl_mem parent = b.kind == BUF_SUB ? b.parent : NULL;
            return answer(&parent, sizeof parent, size, value, size_ret);
        }
        }
    }
    return a->get_mem_object_info(mem, param, size, value, size_ret);
}

EXPORT cl_context clCreateContext(const cl_context_properties *props, cl_uint ndevices,
                                  const cl_device_id *devices, shim_cl_notify_fn notify,
                                  void *user, cl_int *errcode_ret)
{
    cl_api *a = api();
    if (!a || !a->create_context) {
        set_err(errcode_ret, CL_INVALID_VALUE);
        return NULL;
    }
    return ctx_made(a, a->create_context(props, ndevices, devices, notify, user, errcode_ret));
}

EXPORT cl_context clCreateContextFromType(const cl_context_properties *props, cl_device_type type,
                                          shim_cl_notify_fn notify, void *user, cl_int *errcode_ret)
{
    cl_api *a = api();
    if (!a || !a->create_context_from_type) {
        set_err(errcode_ret, CL_INVALID_VALUE);
        return NULL;
    }
    return ctx_made(a, a->create_context_from_type(props, type, notify, user, errcode_ret));
}

EXPORT cl_int clRetainContext(cl_context ctx)
{
    cl_api *a = api();
    if (!a || !a->retain_context)
        return CL_INVALID_CONTEXT;
    cl_int rc = a->retain_context(ctx);
    if (rc == CL_SUCCESS)
        ctx_app_ref(ctx, +1);
    return rc;
}

/* The program's last reference (and nothing served left): the shim's
 * regions and queue go, and with them the context, as without the shim. */
EXPORT cl_int clReleaseContext(cl_context ctx)
{
    cl_api *a = api();
    if (!a)
        return CL_INVALID_CONTEXT;
    cl_int rc = a->release_context(ctx);
    if (rc == CL_SUCCESS) {
        ctx_app_ref(ctx, -1);
        ctx_check_pending(a);
    }
    return rc;
}

/* Where a served buffer (or a sub-buffer of one) lies: its region and
 * its offset there. False for any other object. */
static bool in_region(cl_mem mem, cl_mem *region, size_t *offset)
{
    shim_mutex_lock(&cl_mu);
    buf_rec *b = buf_find_locked(mem);
    region_rec *r = NULL;
    size_t extra = 0;
    if (b && b->kind == BUF_SUB) {
        extra = b->origin;
        b = buf_find_locked(b->parent);
    }
    if (b)
        r = region_find_locked(b->addr);
    if (r) {
        *region = r->mem;
        *offset = b->addr - r->base + extra;
    }
    shim_mutex_unlock(&cl_mu);
    return r != NULL;
}

static size_t mem_size(cl_api *a, cl_mem m)
{
    size_t n = 0;
    if (a->get_mem_object_info(m, CL_MEM_SIZE, sizeof n, &n, NULL) != CL_SUCCESS)
        return 0;
    return n;
}

/* Whether a rectangle with these pitches fits a buffer of `size` bytes,
 * as the specification checks it. */
static bool rect_valid(const size_t *o, const size_t *r, size_t row, size_t slice, size_t size)
{
    if (!r[0] || !r[1] || !r[2] || row < r[0] || slice < r[1] * row || slice % row)
        return false;
    size_t end = (o[2] + r[2] - 1) * slice + (o[1] + r[1] - 1) * row + o[0] + r[0];
    return end <= size;
}

/* Two served buffers of one region with different pitches: one buffer for
 * the runtime, which requires equal pitches for that. The copy is made
 * row by row between the buffers themselves (plain copies of sub-buffers
 * work), a marker standing for the whole. */
static cl_int copy_rect_by_rows(cl_api *a, cl_command_queue q, cl_mem src, cl_mem dst,
                                const size_t *so, const size_t *dor, const size_t *region,
                                size_t src_row, size_t src_slice, size_t dst_row,
                                size_t dst_slice, cl_uint nwait, const cl_event *wait,
                                cl_event *event)
{
    if (!a->enqueue_copy_buffer || !a->enqueue_marker_with_wait_list)
        return CL_INVALID_VALUE;
    if (!rect_valid(so, region, src_row, src_slice, mem_size(a, src)) ||
        !rect_valid(dor, region, dst_row, dst_slice, mem_size(a, dst)))
        return CL_INVALID_VALUE;
    bool first = true;
    for (size_t z = 0; z < region[2]; z++) {
        for (size_t y = 0; y < region[1]; y++) {
            size_t s_at = (so[2] + z) * src_slice + (so[1] + y) * src_row + so[0];
            size_t d_at = (dor[2] + z) * dst_slice + (dor[1] + y) * dst_row + dor[0];
            cl_int rc = a->enqueue_copy_buffer(q, src, dst, s_at, d_at, region[0],
                                               first ? nwait : 0, first ? wait : NULL, NULL);
            if (rc != CL_SUCCESS)
                return rc;
            first = false;
        }
    }
    /* With no wait list a marker waits for everything enqueued before. */
    return event ? a->enqueue_marker_with_wait_list(q, 0, NULL, event) : CL_SUCCESS;
}

/* PoCL 3.1 crashes in a rectangular copy between sub-buffers (without the
 * shim too, tests/integration/test_opencl.py): a served buffer's copy is
 * made on its region instead, its offset added to the origin's first
 * coordinate (bytes) with the pitches made explicit, so the bytes copied
 * are the same. */
EXPORT cl_int clEnqueueCopyBufferRect(cl_command_queue q, cl_mem src, cl_mem dst,
                                      const size_t *src_origin, const size_t *dst_origin,
                                      const size_t *region, size_t src_row, size_t src_slice,
                                      size_t dst_row, size_t dst_slice, cl_uint nwait,
                                      const cl_event *wait, cl_event *event)
{
    cl_api *a = api();
    if (!a || !a->enqueue_copy_buffer_rect)
        return CL_INVALID_VALUE;
    cl_mem sreg, dreg;
    size_t soff = 0, doff = 0;
    bool s_in = in_region(src, &sreg, &soff), d_in = in_region(dst, &dreg, &doff);
    if ((!s_in && !d_in) || !src_origin || !dst_origin || !region || !a->set_event_callback ||
        !a->release_event)
        return a->enqueue_copy_buffer_rect(q, src, dst, src_origin, dst_origin, region, src_row,
                                           src_slice, dst_row, dst_slice, nwait, wait, event);
    size_t so[3] = {src_origin[0], src_origin[1], src_origin[2]};
    size_t dor[3] = {dst_origin[0], dst_origin[1], dst_origin[2]};
    /* The specification's defaults for pitches given as 0. */
    if (!src_row)
        src_row = region[0];
    if (!src_slice)
        src_slice = region[1] * src_row;
    if (!dst_row)
        dst_row = region[0];
    if (!dst_slice)
        dst_slice = region[1] * dst_row;
    if (s_in && d_in && sreg == dreg && (src_row != dst_row || src_slice != dst_slice))
        return copy_rect_by_rows(a, q, src, dst, so, dor, region, src_row, src_slice, dst_row,
                                 dst_slice, nwait, wait, event);
    if (s_in)
        so[0] += soff;
    if (d_in)
        dor[0] += doff;
    return a->enqueue_copy_buffer_rect(q, s_in ? sreg : src, d_in ? dreg : dst, so, dor, region,
                                       src_row, src_slice, dst_row, dst_slice, nwait, wait, event);
}

/* The same crash, the same way round it: copies between an image and a
 * served buffer are made on its region, at its offset. */
EXPORT cl_int clEnqueueCopyImageToBuffer(cl_command_queue q, cl_mem src, cl_mem dst,
                                         const size_t *origin, const size_t *region,
                                         size_t dst_offset, cl_uint nwait, const cl_event *wait,
                                         cl_event *event)
{
    cl_api *a = api();
    if (!a || !a->enqueue_copy_image_to_buffer)
        return CL_INVALID_VALUE;
    cl_mem dreg;
    size_t doff = 0;
    if (!a->set_event_callback || !a->release_event || !in_region(dst, &dreg, &doff))
        return a->enqueue_copy_image_to_buffer(q, src, dst, origin, region, dst_offset, nwait,
                                               wait, event);
    return a->enqueue_copy_image_to_buffer(q, src, dreg, origin, region, dst_offset + doff,
                                           nwait, wait, event);
}

EXPORT cl_int clEnqueueCopyBufferToImage(cl_command_queue q, cl_mem src, cl_mem dst,
                                         size_t src_offset, const size_t *origin,
                                         const size_t *region, cl_uint nwait,
                                         const cl_event *wait, cl_event *event)
{
    cl_api *a = api();
    if (!a || !a->enqueue_copy_buffer_to_image)
        return CL_INVALID_VALUE;
    cl_mem sreg;
    size_t soff = 0;
    if (!a->set_event_callback || !a->release_event || !in_region(src, &sreg, &soff))
        return a->enqueue_copy_buffer_to_image(q, src, dst, src_offset, origin, region, nwait,
                                               wait, event);
    return a->enqueue_copy_buffer_to_image(q, sreg, dst, src_offset + soff, origin, region,
                                           nwait, wait, event);
}

/* The shim's function for a served name, else NULL. */
static void *served_by_name(const char *name)
{
#define BY_NAME(sym)               \
    if (strcmp(name, #sym) == 0) \
        return (void *)sym;
    OPENCL_SERVED(BY_NAME)
#undef BY_NAME
    return NULL;
}

EXPORT void *clGetExtensionFunctionAddress(const char *name)
{
    cl_api *a = api();
    void *p = a && a->get_extension_function_address ? a->get_extension_function_address(name)
                                                       : NULL;
    void *ours = p && name ? served_by_name(name) : NULL;
    return ours ? ours : p;
}

EXPORT void *clGetExtensionFunctionAddressForPlatform(cl_platform_id platform, const char *name)
{
    cl_api *a = api();
    void *p = a && a->get_extension_function_address_for_platform
                  ? a->get_extension_function_address_for_platform(platform, name)
                  : NULL;
    void *ours = p && name ? served_by_name(name) : NULL;
    return ours ? ours : p;
}

/* dlsym(handle, name) (hooks/dlsym.c): the shim's function when `name` is
 * served and `handle`'s object defines it for real (an OpenCL library). */
static void *opencl_lookup(void *handle, const char *name)
{
    if (name[1] != 'l')
        return NULL;
    void *ours = served_by_name(name);
    if (!ours)
        return NULL;
    void *real = shim_real_dlsym(handle, name);
    if (!real || shim_is_own_address(real))
        return NULL;
    cl_api *a = learn(find_in_handle, handle);
    shim_real_dlsym(handle, name); /* dlerror() as the caller's own lookup left it */
    return a ? ours : NULL;
}

/* The blocks of buffers destroyed by the runtime on its own threads since
 * the program's last call: freed before the leak report at exit. */
static void drain_at_exit(void)
{
    drain_destroyed();
}

/* fork(): the child has one thread; a cl_mu held by another thread at
 * fork() would never be released there (docs/locking.md). Not taken in a
 * prepare handler: a thread may hold an arena lock while it waits for
 * cl_mu (a region reserved), and the allocator's prepare handlers take the
 * arena locks. */
static void opencl_atfork_child(void)
{
    pthread_mutex_init(&cl_mu, NULL);
}

__attribute__((constructor)) static void register_opencl_lookup(void)
{
    shim_dlsym_set_lookup(opencl_lookup);
    pthread_atfork(NULL, NULL, opencl_atfork_child);
}
