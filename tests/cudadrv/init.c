/* init: cuInit and the version query; the "initialized" state every other
 * entry point checks first.
 *
 * pthread_once guards initialization (the devices' reservations are made
 * there); afterwards the state is read-only, so the check is lock-free. */
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>

struct cd_options cd_opts;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_int state;   /* 0: not yet, 1: ready, -1: failed */

static void init_once(void)
{
    cd_options_read(&cd_opts);
    /* No visible device (CUDA_VISIBLE_DEVICES): cuInit reports none. */
    atomic_store(&state, cd_opts.devices > 0 && cd_memory_init() ? 1 : -1);
}

CUresult cd_ready(void)
{
    return atomic_load_explicit(&state, memory_order_acquire) == 1
        ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

bool cd_device_valid(CUdevice dev)
{
    return dev >= 0 && dev < cd_opts.devices;
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&once, init_once);
    /* A failed reservation is what a machine without a usable device
     * reports: no device. */
    return atomic_load(&state) == 1 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

/* Works before cuInit, as the real one does (the runtime asks first). */
CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = CUDASTANDIN_DRIVER_VERSION;
    return CUDA_SUCCESS;
}
