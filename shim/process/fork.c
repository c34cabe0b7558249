/* The fork policy: the one place that decides what every lock and every
 * piece of inherited state of every room does across fork() (the table is
 * docs/locking.md, "fork").
 *
 * Two kinds of locks:
 * - Locks that protect state a child must find consistent (each device's
 *   allocator lock, the hook resolution lock, the callback registry, the
 *   native and Python stack interning locks, the pipe lock of checked reads)
 *   are taken by the forking
 *   thread in prepare and released in both processes, so the child inherits
 *   them unlocked with nothing half-updated. Every lock of ours that another
 *   thread may hold at fork() is in one of the two kinds: one left out is
 *   inherited held by a thread that does not exist in the child (the hook
 *   resolution lock was: a thread making its runtime's first call at fork
 *   hung the child's first call). Prepare takes them in the process's lock
 *   order (docs/locking.md): device locks first (their handlers run before
 *   the process-wide ones, see below), then the hook resolution lock, the
 *   registry, then the interning locks, which are leaves, then the trace's
 *   write and buffer locks (the child drops the parent's buffered events
 *   and, with %p in the path, writes a trace of its own).
 * - Locks and threads of python_gc (the interpreter search, the API table,
 *   the GC thread and its mutex, the lifecycle gate) may be held by a thread
 *   waiting for the GIL or the loader, so taking them in prepare could block
 *   fork for as long as that thread waits: the child starts them afresh
 *   instead (no GC thread exists there; it is started again on demand).
 *
 * Order of handlers. glibc runs prepare handlers in reverse order of
 * registration and the others in order. A runtime may take a lock of its
 * own in its prepare handler (libsimdev does), while the allocation path
 * holds a device lock when it calls into the runtime: so a device's
 * handlers are installed only once its runtime has been called (the
 * device's ready hook), after the runtime's own; its prepare then runs
 * first. The process-wide handlers are installed by the constructor, before
 * any of those.
 *
 * The fork gate (shim/base/forkgate.c): walks of the loaded objects (the
 * shim's loader calls, libunwind's unwinding) take the loader's and
 * libunwind's locks, which nobody resets in a child. The process-wide
 * prepare closes the gate first (after the devices' prepare handlers, which
 * glibc runs before it) and waits, bounded by a second, for the walks in
 * flight (they hold no lock of ours: loader.h checks it), and new walks
 * wait while the fork is pending; the process-wide parent and child open
 * it last (before the devices' handlers run). So a child inherits a walk
 * only when one outlasts that second.
 *
 * Per-thread state: the forking thread continues in the child with its
 * thread-locals (inside a pressure event or not, detached from Python or
 * not), which stay true for it. Other threads do not exist there. */
#include <pthread.h>
#include <stdatomic.h>

#include "device.h"
#include "fork.h"
#include "forkgate.h"
#include "collections.h"
#include "control.h"
#include "origin.h"
#include "pressure.h"
#include "passthrough.h"
#include "pygc.h"
#include "pystack.h"
#include "stack.h"
#include "trace.h"

static void prepare(void)
{
    shim_fork_gate_prepare();
    shim_device_publish_atfork_prepare();
    shim_passthrough_atfork_prepare();
    shim_pressure_atfork_prepare();
    shim_stack_atfork_prepare();
    shim_pystack_atfork_prepare();
    shim_collections_atfork_prepare();
    shim_trace_atfork_prepare();
}

static void parent(void)
{
    shim_trace_atfork_parent();
    shim_collections_atfork_parent();
    shim_pystack_atfork_parent();
    shim_stack_atfork_parent();
    shim_pressure_atfork_parent();
    shim_passthrough_atfork_parent();
    shim_device_publish_atfork_parent();
    shim_fork_gate_parent();
}

static void child(void)
{
    shim_trace_atfork_child();
    shim_collections_atfork_child();
    shim_control_atfork_child();
    shim_origin_atfork_child();
    shim_pystack_atfork_child();
    shim_stack_atfork_child();
    shim_pressure_atfork_child();
    /* Runs before the devices' own child handlers (registered later). */
    shim_device_atfork_child_early();
    shim_pygc_atfork_child();
    shim_passthrough_atfork_child();
    shim_passthrough_charge_atfork_child();
    shim_device_publish_atfork_child();
    shim_fork_gate_child();
}

/* One row of handlers per device slot: pthread_atfork takes no argument. */
#define DEVICE_SLOTS(X) \
    X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
#define DEFINE_ROW(i)                                                   \
    static void prepare_##i(void) { shim_device_fork_prepare(i); }     \
    static void parent_##i(void) { shim_device_fork_parent(i); }       \
    static void child_##i(void) { shim_device_fork_child(i); }
DEVICE_SLOTS(DEFINE_ROW)
#define ROW(i) {prepare_##i, parent_##i, child_##i},
static const struct { void (*prepare)(void), (*parent)(void), (*child)(void); }
    device_rows[SHIM_MAX_DEVICES] = {DEVICE_SLOTS(ROW)};
_Static_assert(SHIM_MAX_DEVICES == 16, "one row of fork handlers per device slot");

static void device_ready(size_t i)
{
    if (i < SHIM_MAX_DEVICES)
        pthread_atfork(device_rows[i].prepare, device_rows[i].parent, device_rows[i].child);
}

void shim_fork_init(void)
{
    static atomic_flag done = ATOMIC_FLAG_INIT;
    if (atomic_flag_test_and_set(&done))
        return;
    pthread_atfork(prepare, parent, child);
    shim_device_set_ready_hook(device_ready);
}
