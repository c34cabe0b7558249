/* How OpenCL's entry points reach the shim, and the shim the runtime
 * (docs/opencl.md, "The routes"):
 * - link time: the functions the opencl_*.c files export come first for
 *   programs and libraries linked with -lOpenCL (PyOpenCL's extension);
 * - dlsym on a handle whose object defines them (ctypes, cffi, programs
 *   that open the ICD loader themselves): hooks/dlsym.c asks
 *   opencl_lookup;
 * - clGetExtensionFunctionAddress(ForPlatform), which loaders answer for
 *   core names too: the shim's function replaces an intercepted name's.
 * The runtime's own lookups stay the runtime's: a lookup made by an
 * OpenCL library (the ICD loader looking into a vendor library it
 * opened, PoCL here) gets the vendor's function, so that the loader
 * finds its platforms whatever the program looked up first.
 *
 * Owns: the runtime table of the real functions (runtime_table.h), the
 * table of intercepted entry points (SHIM_OPENCL_API's defined ones). No
 * lock. */
#include <string.h>

#include "hooks.h"
#include "opencl_internal.h"

static bool api_complete(const void *table)
{
    const shim_cl_api *a = table;
    return a->create_buffer && a->create_sub_buffer && a->retain_mem_object &&
           a->release_mem_object && a->get_context_info && a->get_device_info &&
           a->get_mem_object_info;
}

SHIM_RT_TABLE(, shim_cl_table, shim_cl_api, SHIM_OPENCL_API, api_complete,
              "opencl: the OpenCL library's functions were not found in the process");

/* The shim's function for an intercepted name, else NULL. */
static void *ours_by_name(const char *name)
{
#define BY_NAME_1(sym)           \
    if (strcmp(name, #sym) == 0) \
        return (void *)sym;
#define BY_NAME_0(sym)
#define BY_NAME(f, sym, defined, ret, params) BY_NAME_##defined(sym)
    SHIM_OPENCL_API(BY_NAME)
#undef BY_NAME
#undef BY_NAME_0
#undef BY_NAME_1
    return NULL;
}

/* Whether code at `caller` is an OpenCL library's own (it defines the API
 * itself: the ICD loader, a layer, a vendor library), not the program's. */
static bool from_runtime(const void *caller)
{
    return caller && !shim_is_own_address(caller) &&
           shim_object_defines(caller, "clGetPlatformIDs");
}

/* The runtime's answer, or the shim's function where it hands one out for
 * an intercepted name to the program. */
static void *replace(void *theirs, const char *name, const void *caller)
{
    void *ours = theirs && name ? ours_by_name(name) : NULL;
    return ours && !from_runtime(caller) ? ours : theirs;
}

EXPORT void *clGetExtensionFunctionAddress(const char *name)
{
    shim_cl_api *a = shim_cl();
    void *p = a && a->get_extension_function_address ? a->get_extension_function_address(name)
                                                       : NULL;
    return replace(p, name, __builtin_return_address(0));
}

EXPORT void *clGetExtensionFunctionAddressForPlatform(cl_platform_id platform,
                                                              const char *name)
{
    shim_cl_api *a = shim_cl();
    void *p = a && a->get_extension_function_address_for_platform
                  ? a->get_extension_function_address_for_platform(platform, name)
                  : NULL;
    return replace(p, name, __builtin_return_address(0));
}

/* dlsym(handle, name) (hooks/dlsym.c): the shim's function when `name` is
 * intercepted, `handle`'s object defines it for real, and the program,
 * not an OpenCL library, asks. */
static void *opencl_lookup(void *handle, const char *name, const void *caller)
{
    if (name[1] != 'l')
        return NULL;
    void *ours = ours_by_name(name);
    if (!ours || from_runtime(caller))
        return NULL;
    return shim_rt_table_lookup(&shim_cl_table, handle, name, ours);
}

__attribute__((constructor)) static void register_opencl_lookup(void)
{
    shim_dlsym_set_lookup(opencl_lookup);
}
