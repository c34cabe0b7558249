/* Which stream captures are live, as the shim saw them begin and end
 * (hooks/cuda_driver.c wraps cuStreamBeginCapture(_v2)(_ptsz) and
 * cuStreamEndCapture(_ptsz) and reports here), so that the allocator can
 * tell, on its slow paths only, that the calling thread must not wait for
 * the device, give a region back, reserve one or collect
 * (docs/cuda.md, "Stream capture").
 *
 * The driver itself has no "is this thread capturing" query: a capture
 * begun in global or thread-local mode on a non-blocking stream is
 * invisible to cuStreamGetCaptureInfo on the legacy stream, yet the
 * driver refuses (and the capture is invalidated by) a cuMemAlloc or a
 * cuCtxSynchronize made meanwhile. So the shim keeps the captures it saw:
 * the stream, its mode, the thread that began it. A thread is capturing
 * for the shim while a capture it began is live, or while any capture
 * begun in global mode is live (the driver's rule for the default mode:
 * every thread's unsafe calls conflict with it).
 *
 * Owns a fixed table of live captures guarded by `cap_mu`, a leaf lock
 * (docs/locking.md): nothing is called with it held; its own fork
 * handlers. The count of live
 * captures is an atomic read without the lock, so that the common answer
 * (none) costs one load. A capture the program never ends (its stream
 * destroyed while capturing) stays in the table: the safe side (no waits)
 * for that thread. Never calls the driver. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cuda.h"
#include "mutex.h"

#define MAX_CAPTURES 64

static pthread_mutex_t cap_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    CUstream stream;
    unsigned mode;
    pthread_t thread;
} table[MAX_CAPTURES];
static unsigned ncaptures;
static _Atomic unsigned live;
/* Captures that did not fit the table: counted as global ones. */
static _Atomic unsigned overflow;

void shim_cuda_capture_begun(CUstream stream, unsigned mode)
{
    shim_mutex_lock(&cap_mu);
    if (ncaptures < MAX_CAPTURES) {
        table[ncaptures].stream = stream;
        table[ncaptures].mode = mode;
        table[ncaptures].thread = pthread_self();
        ncaptures++;
    } else {
        atomic_fetch_add(&overflow, 1);
    }
    atomic_fetch_add(&live, 1);
    shim_mutex_unlock(&cap_mu);
}

void shim_cuda_capture_ended(CUstream stream)
{
    shim_mutex_lock(&cap_mu);
    for (unsigned i = 0; i < ncaptures; i++)
        if (table[i].stream == stream) {
            table[i] = table[--ncaptures];
            atomic_fetch_sub(&live, 1);
            shim_mutex_unlock(&cap_mu);
            return;
        }
    if (atomic_load(&overflow) > 0) {
        atomic_fetch_sub(&overflow, 1);
        atomic_fetch_sub(&live, 1);
    }
    shim_mutex_unlock(&cap_mu);
}

bool shim_cuda_capture_seen(void)
{
    if (atomic_load_explicit(&live, memory_order_acquire) == 0)
        return false;
    bool yes = atomic_load(&overflow) > 0;
    pthread_t self = pthread_self();
    shim_mutex_lock(&cap_mu);
    for (unsigned i = 0; i < ncaptures && !yes; i++)
        yes = table[i].mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
              pthread_equal(table[i].thread, self);
    shim_mutex_unlock(&cap_mu);
    return yes;
}

/* fork: a leaf lock of its own, so its handlers need no place in the
 * shim's lock order (shim/process/fork.c); the child has one thread and
 * no capture of its own. */
static void atfork_prepare(void)
{
    shim_mutex_lock(&cap_mu);
}

static void atfork_parent(void)
{
    shim_mutex_unlock(&cap_mu);
}

static void atfork_child(void)
{
    ncaptures = 0;
    atomic_store(&live, 0);
    atomic_store(&overflow, 0);
    shim_mutex_unlock(&cap_mu);
}

__attribute__((constructor)) static void register_atfork(void)
{
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}
