/* Compiles the shim's own CUDA declarations (hooks/cuda.h) against the
 * toolkit's cuda.h: every type, constant, struct size and prototype the
 * shim defines or calls must be the real driver's. Never part of the build:
 * tests/integration/test_cuda_toolkit.py compiles it (-fsyntax-only) with
 * the toolkit's include folder and -iquote hooks, where a toolkit is
 * installed.
 *
 * __CUDA_API_VERSION_INTERNAL makes cuda.h declare every versioned symbol
 * under its own name (cuMemAlloc_v2, cuCtxDestroy, ...) instead of mapping
 * the plain names onto the newest versions: the names the shim exports and
 * looks up. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#define SHIM_CUDA_CHECK 1
#include "cuda.h"

#define TYPE(name, type)                                                  \
    _Static_assert(__builtin_types_compatible_p(name, type),              \
                   #name " is not " #type " in cuda.h");
SHIM_CUDA_TYPES(TYPE)

#define CONSTANT(name, value) _Static_assert((name) == (value), #name " is not " #value " in cuda.h");
SHIM_CUDA_CONSTANTS(CONSTANT)

#define SIZE(type, n) _Static_assert(sizeof(type) == (n), "sizeof(" #type ") is not " #n);
SHIM_CUDA_SIZES(SIZE)

#define PROTOTYPE(f, sym, defined, ret, params)                               \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&sym), ret(*) params), \
                   #sym "'s prototype is not cuda.h's");
SHIM_CUDA_DRIVER(PROTOTYPE)

/* The field the shim reads of cuMemCreate's properties. */
_Static_assert(__builtin_offsetof(CUmemAllocationProp, location.id) == 12,
               "CUmemAllocationProp's location.id is not at 12");

int shim_cuda_header_check;
