/* The trace switch and the hooks that feed it (trace.h).
 *
 * Owns nothing but the registration: at init, when SPYRESHIM_TRACE is set,
 * it registers one event hook with the allocator (shim/alloc/device.c),
 * one with the pressure event (shim/alloc/pressure.c) and one with the
 * garbage collector (python_gc/gc/pygc.c); the layers below never include
 * a trace header. Each hook turns its call into one 32-byte event of
 * tracefile.c. No lock of its own.
 *
 * Ordering: allocations, frees and out-of-memory carry the sequence number
 * the allocator took inside its critical section; a pressure event's
 * markers take theirs with the allocator lock held (the event runs under
 * it), a collection's takes one when it ends. Per device, sorting by
 * sequence replays the allocator's own order, so the peak a reader computes
 * is the allocator's peak. */
#include "device.h"
#include "options.h"
#include "pressure.h"
#include "pygc.h"
#include "trace.h"
#include "tracefile.h"
#include "tracefmt.h"

static void on_event(enum shim_event_kind kind, unsigned device, uint64_t seq, uintptr_t addr,
                     size_t size, uint32_t native_stack, uint32_t python_stack)
{
    unsigned k = kind == SHIM_EVENT_ALLOC  ? TRACE_ALLOC
                 : kind == SHIM_EVENT_FREE ? TRACE_FREE
                                           : TRACE_OOM;
    shim_tracefile_append(k, device, seq, addr, size, native_stack, python_stack);
}

static void on_pressure(bool begin, size_t bytes)
{
    shim_tracefile_append(begin ? TRACE_PRESSURE_BEGIN : TRACE_PRESSURE_END, TRACE_DEVICE_NONE,
                          shim_device_seq_next(), 0, bytes, 0, 0);
}

static void on_collection(uint64_t ns, uint64_t freed, long objects)
{
    (void)objects;
    shim_tracefile_append(TRACE_GC, TRACE_DEVICE_NONE, shim_device_seq_next(), ns, freed, 0, 0);
}

void shim_trace_init(void)
{
    const shim_options *o = shim_opts();
    if (!o->trace_path || !o->trace_path[0])
        return;
    shim_tracefile_init(o->trace_path, o->trace_flush_ms);
    shim_device_set_event_hook(on_event);
    shim_pressure_set_event_hook(on_pressure);
    shim_pygc_set_collection_hook(on_collection);
}

void shim_trace_at_exit(void)
{
    shim_tracefile_close();
}

void shim_trace_atfork_prepare(void) { shim_tracefile_atfork_prepare(); }
void shim_trace_atfork_parent(void) { shim_tracefile_atfork_parent(); }
void shim_trace_atfork_child(void) { shim_tracefile_atfork_child(); }
