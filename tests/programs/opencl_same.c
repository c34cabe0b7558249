/* OpenCL programs that must see exactly what they see without the shim
 * (docs/opencl.md, issue 43's cases), run by
 * tests/integration/test_opencl.py without and with it: each check prints
 * what it observes (return codes, data, the runtime's answers), never an
 * address or a time, and the two outputs must be the same.
 *
 *   opencl_same CHECK...
 *
 * rect       rectangular copies between buffers with different pitches on
 *            an out-of-order queue behind a user event; a whole-buffer
 *            rectangle between two disjoint buffers; the copy's event type
 * range      out-of-range rectangle and image-to-buffer copies: refused,
 *            the neighbouring buffer untouched
 * hostflags  CL_MEM_COPY_HOST_PTR with CL_MEM_HOST_NO_ACCESS and
 *            CL_MEM_HOST_READ_ONLY, their contents read back on the device
 * image1d    clCreateImage(CL_MEM_OBJECT_IMAGE1D_BUFFER) over a buffer
 * release    releases while a buffer is mapped and a command waits on a
 *            user event: they return while the event is incomplete, the
 *            destructor callback of a buffer a command still uses runs
 *            after it; 10 large buffers made and released meanwhile
 * contexts   40 contexts each released while a queue holds it, a 48 MiB
 *            buffer made in each (kept across two contexts)
 * retained   a 24 MiB buffer retained once more and released once (still
 *            alive), then a 48 MiB buffer made; again after its last
 *            release (under SPYRESHIM_LIMIT=64M the test expects the first
 *            refused: the retained buffer is charged until its last release)
 * refused    8 x 16 MiB buffers the runtime refuses (CL_MEM_USE_HOST_PTR
 *            without a host pointer), then a 48 MiB buffer; the same with
 *            SVM (an alignment of 3) where the device has it: the answers
 *            (under SPYRESHIM_LIMIT=64M too: what the runtime refused holds
 *            nothing)
 * svmfree    120 x 1 MiB clSVMAlloc, each given back by clEnqueueSVMFree
 * threads    4 threads creating and releasing buffers in a context whose
 *            only reference is its queue's
 * migrate    clEnqueueMigrateMemObjects: two buffers to the host and back
 *            (their contents kept), one with
 *            CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED (written again after,
 *            read back), and the runtime's errors (no objects, a bad flag)
 * badargs    buffers and pipes the runtime refuses for their arguments
 *            alone (flags that exclude each other, size 0, a host pointer
 *            without its flag and the flag without one, a size above the
 *            device's), each of 128 MiB where a size is asked: under
 *            SPYRESHIM_LIMIT=64M the answers are still the runtime's
 *
 * Exit status: the number of checks that could not run (checks.h). */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS 1
#include <CL/cl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "checks.h"

static cl_platform_id plat;
static cl_device_id dev;

static void setup(void)
{
    if (clGetPlatformIDs(1, &plat, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) {
        printf("no OpenCL device\n");
        exit(99);
    }
}

static cl_context new_context(void)
{
    cl_int err;
    cl_context c = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    return err == CL_SUCCESS ? c : NULL;
}

static cl_command_queue new_queue(cl_context c, cl_command_queue_properties props)
{
    cl_queue_properties p[] = {CL_QUEUE_PROPERTIES, props, 0};
    cl_int err;
    cl_command_queue q = clCreateCommandQueueWithProperties(c, dev, props ? p : NULL, &err);
    return err == CL_SUCCESS ? q : NULL;
}

static uint64_t checksum(const unsigned char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A buffer's bytes, read on `q`. */
static uint64_t read_sum(cl_command_queue q, cl_mem m, size_t n)
{
    unsigned char *buf = malloc(n);
    cl_int rc = clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, buf, 0, NULL, NULL);
    uint64_t h = rc == CL_SUCCESS ? checksum(buf, n) : (uint64_t)rc;
    free(buf);
    return h;
}

static cl_mem filled(cl_context c, size_t n, unsigned char seed)
{
    unsigned char *init = malloc(n);
    for (size_t i = 0; i < n; i++)
        init[i] = (unsigned char)(seed + i * 7);
    cl_int err;
    cl_mem m = clCreateBuffer(c, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, init, &err);
    free(init);
    return err == CL_SUCCESS ? m : NULL;
}

static void check_rect(void)
{
    cl_context c = new_context();
    CHECK(c, "no context");
    cl_command_queue q = new_queue(c, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE);
    cl_command_queue in_order = new_queue(c, 0);
    CHECK(q && in_order, "no queue");
    /* Two buffers made one after the other (what a region once held). */
    cl_mem src = filled(c, 4096, 1), dst = filled(c, 4096, 2);
    CHECK(src && dst, "no buffers");
    cl_int err;
    cl_event gate = clCreateUserEvent(c, &err);
    CHECK(err == CL_SUCCESS, "no user event: %d", err);
    size_t so[3] = {0, 0, 0}, dor[3] = {0, 0, 0}, region[3] = {64, 8, 1}, one[3] = {4096, 1, 1};
    cl_event copy;
    cl_int rc = clEnqueueCopyBufferRect(q, src, dst, so, dor, region, 512, 4096, 256, 2048, 1,
                                        &gate, &copy);
    printf("rect pitches rc=%d\n", rc);
    cl_int status = 0;
    clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    printf("rect gate status before=%d\n", status);
    sleep_ms(20);
    clSetUserEventStatus(gate, CL_COMPLETE);
    if (rc == CL_SUCCESS) {
        clWaitForEvents(1, &copy);
        cl_command_type type = 0;
        clGetEventInfo(copy, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL);
        printf("rect event type=%#x\n", (unsigned)type);
        clReleaseEvent(copy);
    }
    clFinish(q);
    printf("rect dst=%016llx\n", (unsigned long long)read_sum(in_order, dst, 4096));
    /* The whole buffer as one rectangle, between two disjoint buffers. */
    rc = clEnqueueCopyBufferRect(in_order, src, dst, so, dor, one, 0, 0, 0, 0, 0, NULL, NULL);
    clFinish(in_order);
    printf("rect whole rc=%d dst=%016llx\n", rc,
           (unsigned long long)read_sum(in_order, dst, 4096));
    clReleaseEvent(gate);
    clReleaseMemObject(src);
    clReleaseMemObject(dst);
    clReleaseCommandQueue(q);
    clReleaseCommandQueue(in_order);
    clReleaseContext(c);
    printf("rect ok\n");
}

static void check_range(void)
{
    cl_context c = new_context();
    CHECK(c, "no context");
    cl_command_queue q = new_queue(c, 0);
    cl_mem a = filled(c, 4096, 3), b = filled(c, 4096, 4), neighbour = filled(c, 4096, 5);
    CHECK(q && a && b && neighbour, "no buffers");
    size_t o[3] = {0, 0, 0}, region[3] = {64, 128, 1};
    cl_int rc = clEnqueueCopyBufferRect(q, a, b, o, o, region, 64, 0, 64, 0, 0, NULL, NULL);
    clFinish(q);
    printf("range rect rc=%d neighbour=%016llx b=%016llx\n", rc,
           (unsigned long long)read_sum(q, neighbour, 4096),
           (unsigned long long)read_sum(q, b, 4096));
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {.image_type = CL_MEM_OBJECT_IMAGE2D, .image_width = 64,
                          .image_height = 64};
    cl_int err;
    cl_mem img = clCreateImage(c, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &err);
    printf("range image err=%d\n", err);
    if (img) {
        size_t io[3] = {0, 0, 0}, ir[3] = {64, 64, 1}; /* 16 KiB into 4 KiB */
        rc = clEnqueueCopyImageToBuffer(q, img, b, io, ir, 0, 0, NULL, NULL);
        clFinish(q);
        printf("range image_to_buffer rc=%d neighbour=%016llx\n", rc,
               (unsigned long long)read_sum(q, neighbour, 4096));
        size_t size = 0;
        clGetMemObjectInfo(img, CL_MEM_SIZE, sizeof size, &size, NULL);
        printf("range image size=%zu\n", size);
        clReleaseMemObject(img);
    }
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(neighbour);
    clReleaseCommandQueue(q);
    clReleaseContext(c);
    printf("range ok\n");
}

static void check_hostflags(void)
{
    cl_context c = new_context();
    cl_command_queue q = c ? new_queue(c, 0) : NULL;
    CHECK(q, "no queue");
    unsigned char init[1024];
    for (size_t i = 0; i < sizeof init; i++)
        init[i] = (unsigned char)(i * 13 + 1);
    const cl_mem_flags host[] = {CL_MEM_HOST_NO_ACCESS, CL_MEM_HOST_READ_ONLY,
                                 CL_MEM_HOST_WRITE_ONLY};
    for (size_t k = 0; k < 3; k++) {
        cl_int err;
        cl_mem m = clCreateBuffer(c, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR | host[k],
                                  sizeof init, init, &err);
        uint64_t sum = 0;
        cl_mem_flags flags = 0;
        if (m) {
            cl_mem copy = clCreateBuffer(c, CL_MEM_READ_WRITE, sizeof init, NULL, &err);
            clEnqueueCopyBuffer(q, m, copy, 0, 0, sizeof init, 0, NULL, NULL);
            sum = read_sum(q, copy, sizeof init);
            clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof flags, &flags, NULL);
            clReleaseMemObject(copy);
            clReleaseMemObject(m);
        }
        printf("hostflags %#llx err=%d flags=%#llx contents=%016llx\n",
               (unsigned long long)host[k], m ? CL_SUCCESS : err, (unsigned long long)flags,
               (unsigned long long)sum);
    }
    clReleaseCommandQueue(q);
    clReleaseContext(c);
    printf("hostflags ok\n");
}

static void check_image1d(void)
{
    cl_context c = new_context();
    CHECK(c, "no context");
    cl_mem buf = filled(c, 1024 * 4, 6);
    CHECK(buf, "no buffer");
    cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc = {.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER, .image_width = 1024,
                          .buffer = buf};
    cl_int err;
    cl_mem img = clCreateImage(c, CL_MEM_READ_ONLY, &fmt, &desc, NULL, &err);
    printf("image1d err=%d\n", err);
    if (img) {
        cl_mem assoc = NULL;
        clGetMemObjectInfo(img, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL);
        cl_uint refs = 0;
        clGetMemObjectInfo(buf, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL);
        printf("image1d over_buffer=%d\n", assoc == buf);
        clReleaseMemObject(img);
    }
    clReleaseMemObject(buf);
    clReleaseContext(c);
    printf("image1d ok\n");
}

static int destroyed;
static void on_destroy(cl_mem m, void *arg)
{
    (void)m;
    (void)arg;
    __atomic_store_n(&destroyed, 1, __ATOMIC_SEQ_CST);
}

static void check_release(void)
{
    cl_context c = new_context();
    cl_command_queue q = c ? new_queue(c, 0) : NULL;
    cl_command_queue other = c ? new_queue(c, 0) : NULL;
    CHECK(q && other, "no queue");
    cl_int err;
    cl_mem mapped = clCreateBuffer(c, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
    void *p = clEnqueueMapBuffer(other, mapped, CL_TRUE, CL_MAP_WRITE, 0, 1 << 20, 0, NULL,
                                 NULL, &err);
    printf("release map err=%d\n", err);
    cl_event gate = clCreateUserEvent(c, &err);
    cl_mem waiting = clCreateBuffer(c, CL_MEM_READ_WRITE, 4096, NULL, &err);
    clSetMemObjectDestructorCallback(waiting, on_destroy, NULL);
    static unsigned char src[4096];
    err = clEnqueueWriteBuffer(q, waiting, CL_FALSE, 0, sizeof src, src, 1, &gate, NULL);
    printf("release queued write err=%d\n", err);
    /* Releases of large buffers, and of the one the write waits for, while
     * the gate is still closed. */
    int released = 0;
    for (int i = 0; i < 10; i++) {
        cl_mem big = clCreateBuffer(c, CL_MEM_READ_WRITE, 64 << 20, NULL, &err);
        if (big && clReleaseMemObject(big) == CL_SUCCESS)
            released++;
    }
    err = clReleaseMemObject(waiting);
    cl_int status = 0;
    clGetEventInfo(gate, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL);
    printf("release released=%d last_rc=%d gate_status=%d destroyed=%d\n", released, err,
           status, __atomic_load_n(&destroyed, __ATOMIC_SEQ_CST));
    clSetUserEventStatus(gate, CL_COMPLETE);
    clFinish(q);
    for (int i = 0; i < 200 && !__atomic_load_n(&destroyed, __ATOMIC_SEQ_CST); i++)
        sleep_ms(5);
    printf("release after gate destroyed=%d\n", __atomic_load_n(&destroyed, __ATOMIC_SEQ_CST));
    clEnqueueUnmapMemObject(other, mapped, p, 0, NULL, NULL);
    clFinish(other);
    clReleaseMemObject(mapped);
    clReleaseEvent(gate);
    clReleaseCommandQueue(q);
    clReleaseCommandQueue(other);
    clReleaseContext(c);
    printf("release ok\n");
}

/* PyOpenCL's cl.CommandQueue(cl.create_some_context()): the queue holds
 * the context the program let go of. */
static void check_contexts(void)
{
    cl_mem kept = NULL;
    cl_command_queue kept_q = NULL;
    for (int i = 0; i < 40; i++) {
        cl_context c = new_context();
        cl_command_queue q = c ? new_queue(c, 0) : NULL;
        CHECK(q, "no queue in round %d", i);
        clReleaseContext(c);
        cl_int err;
        cl_mem m = clCreateBuffer(c, CL_MEM_READ_WRITE, 48 << 20, NULL, &err);
        if (m) {
            unsigned char b = (unsigned char)i;
            err = clEnqueueWriteBuffer(q, m, CL_TRUE, 0, 1, &b, 0, NULL, NULL);
        }
        if (i == 38 || i == 39)
            printf("contexts round=%d err=%d\n", i, err);
        if (i == 38) { /* kept while the next context makes its own */
            kept = m;
            kept_q = q;
            continue;
        }
        if (m)
            clReleaseMemObject(m);
        clReleaseCommandQueue(q);
    }
    if (kept)
        clReleaseMemObject(kept);
    clReleaseCommandQueue(kept_q);
    printf("contexts ok\n");
}

static void check_retained(void)
{
    cl_context c = new_context();
    CHECK(c, "no context");
    cl_int err;
    cl_mem a = clCreateBuffer(c, CL_MEM_READ_WRITE, 24 << 20, NULL, &err);
    CHECK(a, "no 24 MiB buffer: %d", err);
    cl_int retained = clRetainMemObject(a);
    printf("retain=%d release=%d\n", retained, clReleaseMemObject(a));
    size_t size = 0;
    printf("still alive=%d size=%zu\n",
           clGetMemObjectInfo(a, CL_MEM_SIZE, sizeof size, &size, NULL), size);
    for (int round = 0; round < 2; round++) {
        cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, 48 << 20, NULL, &err);
        printf("retained round=%d err=%d\n", round, err);
        if (b)
            clReleaseMemObject(b);
        if (round == 0)
            printf("last release=%d\n", clReleaseMemObject(a));
    }
    clReleaseContext(c);
    printf("retained ok\n");
}

static void check_refused(void)
{
    cl_context c = new_context();
    CHECK(c, "no context");
    cl_int err;
    printf("refused");
    for (int i = 0; i < 8; i++) {
        cl_mem m = clCreateBuffer(c, CL_MEM_USE_HOST_PTR, 16 << 20, NULL, &err);
        printf(" %d", err);
        if (m)
            clReleaseMemObject(m);
    }
    cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, 48 << 20, NULL, &err);
    printf("\nthen 48 MiB err=%d\n", err);
    if (b)
        clReleaseMemObject(b);
    cl_device_svm_capabilities caps = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL) ==
            CL_SUCCESS &&
        caps) {
        /* An alignment that is no power of two: refused by the runtime. */
        printf("refused svm");
        for (int i = 0; i < 8; i++) {
            void *p = clSVMAlloc(c, CL_MEM_READ_WRITE, 16 << 20, 3);
            printf(" %d", p != NULL);
            if (p)
                clSVMFree(c, p);
        }
        void *p = clSVMAlloc(c, CL_MEM_READ_WRITE, 48 << 20, 0);
        printf("\nthen 48 MiB of svm: %d\n", p != NULL);
        if (p)
            clSVMFree(c, p);
    }
    clReleaseContext(c);
    printf("refused ok\n");
}

static void check_svmfree(void)
{
    cl_device_svm_capabilities caps = 0;
    if (clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL) !=
            CL_SUCCESS ||
        !caps) {
        printf("svmfree none\n");
        return;
    }
    cl_context c = new_context();
    cl_command_queue q = c ? new_queue(c, 0) : NULL;
    CHECK(q, "no queue");
    int failed = 0;
    for (int i = 0; i < 120; i++) {
        void *p = clSVMAlloc(c, CL_MEM_READ_WRITE, 1 << 20, 0);
        if (!p) {
            failed++;
            continue;
        }
        cl_int rc = clEnqueueSVMFree(q, 1, &p, NULL, NULL, 0, NULL, NULL);
        if (rc != CL_SUCCESS)
            printf("svmfree rc=%d\n", rc);
        clFinish(q);
    }
    printf("svmfree failed=%d\n", failed);
    clReleaseCommandQueue(q);
    clReleaseContext(c);
    printf("svmfree ok\n");
}

static cl_context shared_ctx;
static void *churn(void *arg)
{
    long seed = (long)(intptr_t)arg;
    long bad = 0;
    for (int i = 0; i < 2000; i++) {
        cl_int err;
        size_t n = 256 + (size_t)((seed * 7919 + i * 104729) % 65536);
        cl_mem m = clCreateBuffer(shared_ctx, CL_MEM_READ_WRITE, n, NULL, &err);
        if (!m) {
            bad++;
            continue;
        }
        if (i % 3 == 0) {
            clRetainMemObject(m);
            clReleaseMemObject(m);
        }
        if (clReleaseMemObject(m) != CL_SUCCESS)
            bad++;
    }
    return (void *)(intptr_t)bad;
}

static void check_threads(void)
{
    shared_ctx = new_context();
    cl_command_queue q = shared_ctx ? new_queue(shared_ctx, 0) : NULL;
    CHECK(q, "no queue");
    clReleaseContext(shared_ctx); /* the queue's reference keeps it */
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churn, (void *)(intptr_t)i);
    long bad = 0;
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        bad += (long)(intptr_t)r;
    }
    clReleaseCommandQueue(q);
    printf("threads bad=%ld\nthreads ok\n", bad);
}

static void check_migrate(void)
{
    cl_context c = new_context();
    cl_command_queue q = c ? new_queue(c, 0) : NULL;
    CHECK(q, "no queue");
    cl_mem a = filled(c, 8192, 7), b = filled(c, 8192, 8), scratch = filled(c, 8192, 9);
    CHECK(a && b && scratch, "no buffers");
    cl_mem both[2] = {a, b};
    cl_event ev;
    cl_int rc = clEnqueueMigrateMemObjects(q, 2, both, CL_MIGRATE_MEM_OBJECT_HOST, 0, NULL, &ev);
    printf("migrate to host rc=%d\n", rc);
    if (rc == CL_SUCCESS) {
        clWaitForEvents(1, &ev);
        cl_command_type type = 0;
        clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof type, &type, NULL);
        printf("migrate event type=%#x\n", (unsigned)type);
        clReleaseEvent(ev);
    }
    rc = clEnqueueMigrateMemObjects(q, 2, both, 0, 0, NULL, NULL);
    clFinish(q);
    printf("migrate back rc=%d a=%016llx b=%016llx\n", rc,
           (unsigned long long)read_sum(q, a, 8192), (unsigned long long)read_sum(q, b, 8192));
    /* Its contents may be dropped: only the call's answer is the same;
     * written again, the buffer reads back what was written. */
    rc = clEnqueueMigrateMemObjects(q, 1, &scratch, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0,
                                    NULL, NULL);
    clFinish(q);
    static unsigned char fresh[8192];
    for (size_t i = 0; i < sizeof fresh; i++)
        fresh[i] = (unsigned char)(i * 5 + 3);
    cl_int wrc = clEnqueueWriteBuffer(q, scratch, CL_TRUE, 0, sizeof fresh, fresh, 0, NULL, NULL);
    printf("migrate undefined rc=%d write=%d scratch=%016llx a=%016llx\n", rc, wrc,
           (unsigned long long)read_sum(q, scratch, 8192),
           (unsigned long long)read_sum(q, a, 8192));
    rc = clEnqueueMigrateMemObjects(q, 1, &scratch,
                                    CL_MIGRATE_MEM_OBJECT_HOST |
                                        CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED,
                                    0, NULL, NULL);
    clFinish(q);
    printf("migrate undefined to host rc=%d\n", rc);
    printf("migrate none rc=%d\n", clEnqueueMigrateMemObjects(q, 0, NULL, 0, 0, NULL, NULL));
    printf("migrate bad flag rc=%d\n", clEnqueueMigrateMemObjects(q, 1, &a, 1 << 6, 0, NULL,
                                                                  NULL));
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(scratch);
    clReleaseCommandQueue(q);
    clReleaseContext(c);
    printf("migrate ok\n");
}

static void check_badargs(void)
{
    cl_context c = new_context();
    CHECK(c, "no context");
    static const struct {
        const char *what;
        cl_mem_flags flags;
        size_t size;
        int with_ptr;
    } cases[] = {
        {"read_only|write_only", CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY, 128 << 20, 0},
        {"read_write|read_only", CL_MEM_READ_WRITE | CL_MEM_READ_ONLY, 128 << 20, 0},
        {"use|copy_host_ptr", CL_MEM_USE_HOST_PTR | CL_MEM_COPY_HOST_PTR, 128 << 20, 1},
        {"use|alloc_host_ptr", CL_MEM_USE_HOST_PTR | CL_MEM_ALLOC_HOST_PTR, 128 << 20, 1},
        {"host_read|host_write", CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_WRITE_ONLY, 128 << 20, 0},
        {"host_no_access|host_read", CL_MEM_HOST_NO_ACCESS | CL_MEM_HOST_READ_ONLY, 128 << 20,
         0},
        {"copy_host_ptr without one", CL_MEM_COPY_HOST_PTR, 128 << 20, 0},
        {"use_host_ptr without one", CL_MEM_USE_HOST_PTR, 128 << 20, 0},
        {"a pointer without its flag", CL_MEM_READ_WRITE, 128 << 20, 1},
        {"size 0", CL_MEM_READ_WRITE, 0, 0},
        {"size 0 and bad flags", CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY, 0, 0},
        {"above the device", CL_MEM_READ_WRITE, (size_t)1 << 62, 0},
        {"above the device and bad flags", CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY,
         (size_t)1 << 62, 0},
    };
    static char host[64]; /* never read: every request is refused first */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cl_int err = 1, err2 = 1;
        cl_mem m = clCreateBuffer(c, cases[i].flags, cases[i].size,
                                  cases[i].with_ptr ? host : NULL, &err);
        cl_mem m2 = clCreateBufferWithProperties(c, NULL, cases[i].flags, cases[i].size,
                                                 cases[i].with_ptr ? host : NULL, &err2);
        printf("badargs %s: %d %d%s\n", cases[i].what, err, err2, m || m2 ? " (made)" : "");
        if (m)
            clReleaseMemObject(m);
        if (m2)
            clReleaseMemObject(m2);
    }
    /* Pipes: read-only (not a pipe's flag) and no packets, 128 MiB asked. */
    cl_int err = 1;
    cl_mem p = clCreatePipe(c, CL_MEM_READ_ONLY, 1024, 128 * 1024, NULL, &err);
    printf("badargs pipe read_only: %d%s\n", err, p ? " (made)" : "");
    if (p)
        clReleaseMemObject(p);
    err = 1;
    p = clCreatePipe(c, CL_MEM_READ_WRITE, 0, 128 * 1024, NULL, &err);
    printf("badargs pipe of no packet size: %d%s\n", err, p ? " (made)" : "");
    if (p)
        clReleaseMemObject(p);
    clReleaseContext(c);
    printf("badargs ok\n");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    setup();
    static const struct named_check checks[] = {
        {"rect", check_rect},       {"range", check_range},   {"hostflags", check_hostflags},
        {"image1d", check_image1d}, {"release", check_release}, {"contexts", check_contexts},
        {"svmfree", check_svmfree}, {"threads", check_threads},   {"retained", check_retained},
        {"refused", check_refused}, {"migrate", check_migrate},   {"badargs", check_badargs},
    };
    return run_checks(argc, argv, checks, sizeof checks / sizeof checks[0]);
}
