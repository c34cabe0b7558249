/* Where handed-off work came from: spyreshim_origin_begin/end (spyreshim.h).
 *
 * A framework that runs a Python call's work on a thread of its own (the
 * autograd engine runs backward() on a device thread that has no Python
 * frame) brackets the call with begin/end on the calling thread (the
 * PyTorch preset does, spyreshim/presets/torch.py). begin interns the caller's own
 * Python stack, flagged SHIM_PYSTACK_ORIGIN (its own thread's frames: read
 * as every capture reads them, never another thread's); an allocation on a
 * thread without Python frames while exactly one such call runs records it
 * as its Python stack (leak.c), and reports show it after the native
 * frames as the origin of the work, not as their caller.
 *
 * Owns one atomic word: the number of calls running (high half) and the
 * origin stack id (low half), kept only while exactly one runs: with two
 * at once the work of either may be running, so none is named (and stays
 * unnamed until all have ended) rather than a guess. No lock; never blocks;
 * reads no other thread's memory. Fork: the child starts with none running
 * (shim_origin_atfork_child): the parent's calls go on in the parent, and
 * an end in the child without its begin there does nothing. */
#include <limits.h>
#include <stdatomic.h>

#include "origin.h"
#include "pystack.h"
#include "spyreshim.h"

static _Atomic uint64_t g_origin;      /* count << 32 | stack id */

SPYRESHIM_API uint32_t spyreshim_origin_begin(void)
{
    uint32_t id = shim_pystack_capture_origin(UINT_MAX);
    uint64_t w = atomic_load_explicit(&g_origin, memory_order_relaxed), nw;
    do {
        uint64_t n = w >> 32;
        if (n == UINT32_MAX)
            return 0;                  /* cannot count further: leave it as it is */
        nw = (n + 1) << 32 | (n == 0 ? id : 0);
    } while (!atomic_compare_exchange_weak_explicit(&g_origin, &w, nw, memory_order_acq_rel,
                                                    memory_order_relaxed));
    return id;
}

SPYRESHIM_API void spyreshim_origin_end(uint32_t token)
{
    (void)token;
    uint64_t w = atomic_load_explicit(&g_origin, memory_order_relaxed), nw;
    do {
        uint64_t n = w >> 32;
        if (n == 0)
            return;                    /* an end without a begin: nothing to undo */
        /* The last one ends: nothing runs. With more running the id is
         * already 0 (begin cleared it) and stays 0: which call is left is
         * not known. */
        nw = n == 1 ? 0 : (n - 1) << 32;
    } while (!atomic_compare_exchange_weak_explicit(&g_origin, &w, nw, memory_order_acq_rel,
                                                    memory_order_relaxed));
}

void shim_origin_atfork_child(void)
{
    atomic_store_explicit(&g_origin, 0, memory_order_relaxed);
}

uint32_t shim_origin_current(void)
{
    uint64_t w = atomic_load_explicit(&g_origin, memory_order_acquire);
    return (w >> 32) == 1 ? (uint32_t)w : 0;
}
