/* simdev: a simulated accelerator runtime with CUDA's error numbers.
 *
 * Device memory is an address range the host cannot touch: a load or store
 * through a device pointer faults (SIGSEGV). Only simdevMemset/simdevMemcpy
 * move bytes in and out. Capacity comes from SIMDEV_MEMORY (bytes with an
 * optional binary suffix K, M, G or T; default 1G) and is reserved, never
 * committed, so capacities far above the host's RAM work as long as the
 * memory is not written.
 *
 * Every function is thread-safe and initializes the device on first use.
 * After fork() the child keeps a private copy-on-write snapshot of the
 * device: it can use inherited allocations and make new ones without the
 * parent seeing any of it (and vice versa). */
#ifndef SIMDEV_H
#define SIMDEV_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SIMDEV_API __attribute__((visibility("default")))

typedef int simdevError_t;

enum {
    simdevSuccess = 0,
    simdevErrorInvalidValue = 1,
    simdevErrorMemoryAllocation = 2,
};

enum {
    simdevMemcpyHostToDevice = 1,
    simdevMemcpyDeviceToHost = 2,
    simdevMemcpyDeviceToDevice = 3,
};

/* Blocks are 256-byte aligned. size 0: success and *ptr = NULL. */
SIMDEV_API simdevError_t simdevMalloc(void **ptr, size_t size);
/* NULL: success. Anything but a live block's start: 1, nothing changes. */
SIMDEV_API simdevError_t simdevFree(void *ptr);
/* free = capacity - bytes allocated (rounded to 256), total = capacity. */
SIMDEV_API simdevError_t simdevMemGetInfo(size_t *free, size_t *total);
/* Device ranges must lie inside one live allocation, else 1. */
SIMDEV_API simdevError_t simdevMemset(void *dst, int value, size_t count);
SIMDEV_API simdevError_t simdevMemcpy(void *dst, const void *src, size_t count, int kind);
SIMDEV_API const char *simdevGetErrorString(simdevError_t err);

#ifdef __cplusplus
}
#endif

#endif
