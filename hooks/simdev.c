/* The simulated device's entry points (tests/simdev). Error numbers are
 * CUDA's: 1 invalid value, 2 out of memory; blocks 256-byte aligned. */
#include "hooks.h"

#define SIMDEV_ENTRY_POINTS(X) \
    X(MALLOC, simdevMalloc)    \
    X(FREE, simdevFree)        \
    X(MEMINFO, simdevMemGetInfo)

SHIM_HOOK_RUNTIME("simdev", SIMDEV_ENTRY_POINTS, 1, 2, 256)
