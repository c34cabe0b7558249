/* A program that loads the ICD loader itself and looks clCreateBuffer up
 * before it asks for platforms (hashcat's order), not linked with
 * libOpenCL: run by tests/integration/test_opencl.py without and with the
 * shim, the same output both ways. Prints what the loader answers, then
 * makes and releases one buffer through the functions it looked up.
 *
 *   opencl_dlopen [LIBRARY]     (default libOpenCL.so.1) */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef void *cl_handle;

int main(int argc, char **argv)
{
    const char *lib = argc > 1 ? argv[1] : "libOpenCL.so.1";
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        printf("dlopen failed\n");
        return 1;
    }
    /* Looked up first, before anything asked the loader for platforms. */
    cl_handle (*create_buffer)(cl_handle, uint64_t, size_t, void *, cl_int *) =
        (cl_handle(*)(cl_handle, uint64_t, size_t, void *, cl_int *))dlsym(h, "clCreateBuffer");
    cl_int (*release)(cl_handle) = (cl_int(*)(cl_handle))dlsym(h, "clReleaseMemObject");
    cl_int (*get_platforms)(cl_uint, cl_handle *, cl_uint *) =
        (cl_int(*)(cl_uint, cl_handle *, cl_uint *))dlsym(h, "clGetPlatformIDs");
    cl_int (*get_devices)(cl_handle, uint64_t, cl_uint, cl_handle *, cl_uint *) =
        (cl_int(*)(cl_handle, uint64_t, cl_uint, cl_handle *, cl_uint *))dlsym(h, "clGetDeviceIDs");
    cl_handle (*create_context)(const intptr_t *, cl_uint, const cl_handle *, void *, void *,
                                cl_int *) =
        (cl_handle(*)(const intptr_t *, cl_uint, const cl_handle *, void *, void *,
                      cl_int *))dlsym(h, "clCreateContext");
    cl_int (*release_context)(cl_handle) = (cl_int(*)(cl_handle))dlsym(h, "clReleaseContext");
    printf("found create=%d release=%d platforms=%d\n", create_buffer != NULL, release != NULL,
           get_platforms != NULL);
    if (!create_buffer || !release || !get_platforms || !get_devices || !create_context ||
        !release_context)
        return 1;
    cl_uint n = 0;
    cl_int rc = get_platforms(0, NULL, &n);
    printf("clGetPlatformIDs rc=%d platforms=%u\n", rc, n);
    if (rc != 0 || n == 0)
        return 1;
    cl_handle plat, dev;
    get_platforms(1, &plat, NULL);
    rc = get_devices(plat, 0xFFFFFFFF, 1, &dev, NULL);
    cl_int err = 0;
    cl_handle ctx = create_context(NULL, 1, &dev, NULL, NULL, &err);
    printf("devices rc=%d context err=%d\n", rc, err);
    cl_handle m = create_buffer(ctx, 1, 1 << 20, NULL, &err);
    printf("buffer err=%d release=%d\n", err, m ? release(m) : -1);
    release_context(ctx);
    return 0;
}
