/* The trace switch and the hooks that feed it (trace.h).
 *
 * Owns nothing but the registration: at init, when SPYRESHIM_TRACE is set,
 * it registers one event hook with the allocator (shim/alloc/device.c;
 * called by alloc_path.c, free_path.c and context.c), one with the
 * pressure event (shim/alloc/pressure.c), one with the
 * garbage collector (python_gc/gc/pygc.c) and one with the interpreter's
 * shutdown (python_gc/interp/gate.c's close); the layers below never include
 * a trace header. Each hook turns its call into one 32-byte event of
 * tracebuf.c. It also wires the trace's parts together at init (the
 * buffers open the file and start the writer with the first event; the
 * SIGTERM handler asks the writer for a flush) and runs their fork
 * handlers in lock order (writer, buffers, sites). No lock of its own.
 *
 * Ordering: allocations, frees and out-of-memory carry the sequence number
 * the allocator took inside its critical section; a pressure event's
 * markers take theirs with the allocator lock held (the event runs under
 * it), a collection's takes one when it ends. Per device, sorting by
 * sequence replays the allocator's own order, so the peak a reader computes
 * is the allocator's peak. */
#include "device.h"
#include "options.h"
#include "gate.h"
#include "passthrough.h"
#include "pressure.h"
#include "pygc.h"
#include "sigterm.h"
#include "trace.h"
#include "tracebuf.h"
#include "tracefile.h"
#include "tracefmt.h"
#include "tracesites.h"
#include "tracewriter.h"

static void on_event(enum shim_event_kind kind, unsigned device, uint64_t seq, uintptr_t addr,
                     size_t size, uint32_t native_stack, uint32_t python_stack)
{
    unsigned k = kind == SHIM_EVENT_ALLOC           ? TRACE_ALLOC
                 : kind == SHIM_EVENT_FREE          ? TRACE_FREE
                 : kind == SHIM_EVENT_SEGMENT_ALLOC ? TRACE_SEGMENT_ALLOC
                 : kind == SHIM_EVENT_SEGMENT_FREE  ? TRACE_SEGMENT_FREE
                                                    : TRACE_OOM;
    shim_tracebuf_append(k, device, seq, addr, size, native_stack, python_stack);
}

static void on_passthrough(bool alloc, enum shim_pt_family f, int device, uint64_t seq,
                           uintptr_t addr, size_t size, uint32_t native_stack,
                           uint32_t python_stack)
{
    unsigned dev = device >= 0                 ? (unsigned)device
                   : f == SHIM_PT_MANAGED       ? TRACE_DEVICE_MANAGED
                   : f == SHIM_PT_HOST_PINNED ? TRACE_DEVICE_HOST_PINNED
                   : f == SHIM_PT_ASYNC       ? TRACE_DEVICE_ASYNC
                   : f == SHIM_PT_OPENCL_MEM    ? TRACE_DEVICE_OPENCL_MEM
                   : f == SHIM_PT_OPENCL_SVM    ? TRACE_DEVICE_OPENCL_SVM
                                              : TRACE_DEVICE_VMM;
    shim_tracebuf_append(alloc ? TRACE_ALLOC : TRACE_FREE, dev, seq, addr, size, native_stack,
                         python_stack);
}

static void on_pool_trim(uint64_t seq, uintptr_t pool, size_t released)
{
    shim_tracebuf_append(TRACE_POOL_TRIM, TRACE_DEVICE_ASYNC, seq, pool, released, 0, 0);
}

static void on_pressure(bool begin, size_t bytes)
{
    shim_tracebuf_append(begin ? TRACE_PRESSURE_BEGIN : TRACE_PRESSURE_END, TRACE_DEVICE_NONE,
                         shim_device_seq_next(), 0, bytes, 0, 0);
}

static void on_collection(uint64_t ns, uint64_t freed, long objects)
{
    (void)objects;
    shim_tracebuf_append(TRACE_GC, TRACE_DEVICE_NONE, shim_device_seq_next(), ns, freed, 0, 0);
}

/* When the interpreter begins to shut down (the lifecycle gate's close,
 * GIL held): `report --diff TRACE` compares the start with this moment,
 * before the exit's teardown frees what the program held. Registered
 * without arming the gate: a process whose Python frames are recorded
 * arms it (pystack.c), one without Python never closes it. */
static void on_shutdown(void)
{
    shim_tracebuf_append(TRACE_SHUTDOWN, TRACE_DEVICE_NONE, shim_device_seq_next(), 0, 0, 0, 0);
}

/* Set once by init: whether this process records. */
static bool g_tracing;

void shim_trace_init(void)
{
    const shim_options *o = shim_opts();
    if (!shim_tracefile_init(o->trace_path))
        return;
    g_tracing = true;
    shim_tracewriter_init(o->trace_flush_ms);
    shim_tracebuf_init(shim_tracewriter_start);
    shim_device_set_event_hook(on_event);
    shim_passthrough_set_event_hook(on_passthrough);
    shim_passthrough_set_trim_hook(on_pool_trim);
    shim_pressure_set_event_hook(on_pressure);
    shim_pygc_set_collection_hook(on_collection);
    shim_gate_on_close(on_shutdown);
    /* SIGTERM (how job limits end a process) flushes first, then the
     * program's own handling proceeds (shim/base/sigterm.c). */
    shim_sigterm_install(shim_tracewriter_signal_flush);
}

void shim_trace_at_exit(void)
{
    if (g_tracing)
        shim_tracewriter_close();
}

void shim_trace_atfork_prepare(void)
{
    shim_tracewriter_atfork_prepare();
    shim_tracebuf_atfork_prepare();
    shim_tracesites_atfork_prepare();
}

void shim_trace_atfork_parent(void)
{
    shim_tracesites_atfork_parent();
    shim_tracebuf_atfork_parent();
    shim_tracewriter_atfork_parent();
}

void shim_trace_atfork_child(void)
{
    /* The parent writes what it buffered; the child drops it and, with
     * %p in the path, starts a file of its own with its next event. */
    shim_sigterm_atfork_child();
    shim_tracesites_atfork_child();
    shim_tracebuf_atfork_child();
    shim_tracefile_atfork_child();
    shim_tracewriter_atfork_child();
}
