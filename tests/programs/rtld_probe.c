/* A second preloaded library that uses dlsym(RTLD_NEXT) the way
 * interposers do (tests/integration/test_cuda_driver.py preloads it before
 * and after the shim): RTLD_NEXT must stay relative to this object even
 * though the shim interposes dlsym. */
#include <dlfcn.h>

__attribute__((visibility("default"))) void *rtld_probe_next(const char *name)
{
    /* Not a tail call: glibc takes the caller from the return address,
     * which must be in this object. */
    void *volatile p = dlsym(RTLD_NEXT, name);
    return p;
}
