/* What dlsym answers under the shim (tests/integration/test_cuda_driver.py).
 * Prints one "key value" line per fact; the test decides what is right.
 *
 *   next <object>        the object that defines what rtld_probe_next (a
 *                        preloaded probe library) gets for simdevMalloc
 *                        through dlsym(RTLD_NEXT)
 *   missing <0|1>        dlsym(RTLD_NEXT) of a missing name is NULL and
 *                        dlerror() names it
 *   driver:<name> <object>  dlsym on a dlopen()ed driver handle, as numba
 *                        does (argv[1] is the driver's path)
 *   idiom <object> <error>  the POSIX idiom on the driver argv[2] (a minimal
 *                        one): dlerror(); dlsym(h, "cuMemAlloc_v2");
 *                        dlerror(), which must say nothing ("none")
 *   vsym <object> <error>   dlvsym(h, "cuMemAlloc_v2", "CUDA_MINI_1.0") on it
 *   vsym-wrong <object> <error>  the same at a version it does not have */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "simdev.h"

/* Linked for real (not dropped by --as-needed): simdevMalloc must be defined
 * after the shim in the search order. */
void *volatile dlsym_checks_keep = (void *)simdevMalloc;

static const char *object_of(void *p)
{
    Dl_info di;
    if (!p)
        return "NULL";
    if (!dladdr(p, &di) || !di.dli_fname)
        return "?";
    const char *slash = strrchr(di.dli_fname, '/');
    return slash ? slash + 1 : di.dli_fname;
}

int main(int argc, char **argv)
{
    void *(*probe)(const char *);
    *(void **)&probe = dlsym(RTLD_DEFAULT, "rtld_probe_next");
    if (probe) {
        printf("next %s\n", object_of(probe("simdevMalloc")));
        void *none = probe("spyreshim_no_such_symbol");
        const char *err = dlerror();
        printf("missing %d\n", none == NULL && err && strstr(err, "spyreshim_no_such_symbol"));
    }
    if (argc > 2) {
        void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("dlopen-failed %s\n", dlerror());
            return 1;
        }
        dlerror();
        void *p = dlsym(h, "cuMemAlloc_v2");
        const char *err = dlerror();
        printf("idiom %s %s\n", object_of(p), err ? err : "none");
        p = dlvsym(h, "cuMemAlloc_v2", "CUDA_MINI_1.0");
        err = dlerror();
        printf("vsym %s %s\n", object_of(p), err ? "error" : "none");
        p = dlvsym(h, "cuMemAlloc_v2", "CUDA_MINI_9.9");
        err = dlerror();
        printf("vsym-wrong %s %s\n", object_of(p), err && strstr(err, "CUDA_MINI_9.9") ? "error" : "none");
    }
    if (argc > 1 && argv[1][0]) {
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("dlopen-failed %s\n", dlerror());
            return 1;
        }
        static const char *names[] = {"cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2",
                                      "cuMemAllocPitch_v2", "cuGetProcAddress_v2",
                                      "cuMemsetD8_v2", "cuMemAlloc", "cuInit"};
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            printf("driver:%s %s\n", names[i], object_of(dlsym(h, names[i])));
        void *none = dlsym(h, "cuNoSuchFunction");
        const char *err = dlerror();
        printf("driver-missing %d\n", none == NULL && err && strstr(err, "cuNoSuchFunction"));
    }
    return 0;
}
