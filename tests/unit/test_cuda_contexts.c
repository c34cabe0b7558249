/* hooks/cuda_contexts.c, the table of the contexts the program made or
 * retained, by device: what shim_cuda_contexts_of answers after a
 * context is made, made again under the same handle on another device,
 * destroyed, and when the table is full. */
#include <criterion/criterion.h>
#include <stdint.h>

#include "cuda.h"

#define CTX(n) ((CUcontext)(uintptr_t)(0x1000 + 16 * (n)))

static size_t of(int ordinal, uintptr_t *out)
{
    return shim_cuda_contexts_of(ordinal, out, 8);
}

Test(cuda_contexts, a_context_is_listed_on_its_device_until_destroyed)
{
    uintptr_t out[8];
    shim_cuda_context_created(CTX(1), 0);
    shim_cuda_context_created(CTX(2), 1);
    cr_assert_eq(of(0, out), 1);
    cr_assert_eq(out[0], (uintptr_t)CTX(1));
    cr_assert_eq(of(1, out), 1);
    cr_assert_eq(out[0], (uintptr_t)CTX(2));
    shim_cuda_context_destroyed(CTX(1));
    cr_assert_eq(of(0, out), 0);
    cr_assert_eq(of(1, out), 1);
}

/* A handle the driver gives out again after a teardown the shim did not
 * see: listed once, on its new device only. */
Test(cuda_contexts, a_handle_registered_again_is_on_its_new_device_only)
{
    uintptr_t out[8];
    shim_cuda_context_created(CTX(3), 0);
    shim_cuda_context_created(CTX(3), 1);
    cr_assert_eq(of(0, out), 0, "still listed on its old device");
    cr_assert_eq(of(1, out), 1);
    cr_assert_eq(out[0], (uintptr_t)CTX(3));
}

/* A retain of a primary context registers it again on the same device:
 * still one entry. */
Test(cuda_contexts, a_context_registered_twice_is_listed_once)
{
    uintptr_t out[8];
    shim_cuda_context_created(CTX(4), 2);
    shim_cuda_context_created(CTX(4), 2);
    cr_assert_eq(of(2, out), 1);
}
