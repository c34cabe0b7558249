/* What the two CUDA routes (cuda_runtime.c, cuda_driver.c) and the dlsym
 * interposition (dlsym.c) tell each other. */
#ifndef SHIM_HOOKS_CUDA_H
#define SHIM_HOOKS_CUDA_H

#include <stdbool.h>

/* The CUDA runtime got the shim's cuMemAlloc_v2 through cuGetProcAddress:
 * its cudaMalloc reaches the driver route, where it is served, so the
 * runtime route passes its calls straight through. */
bool shim_cuda_driver_routed(void);

/* For dlsym(handle, name): the shim's wrapper when `name` is a driver entry
 * point the shim serves and `handle`'s object really defines it (a CUDA
 * driver); NULL for everything else. No lock held; calls the loader. */
void *shim_cuda_driver_lookup(void *handle, const char *name);

#endif
