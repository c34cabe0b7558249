/* The pressure-callback registry and the pressure event: what the allocator
 * does when a request cannot be served. See spyreshim.h for the contract a
 * callback follows. */
#ifndef SHIM_PRESSURE_H
#define SHIM_PRESSURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "lock.h"

typedef struct shim_pressure_state {
    /* Guarded by the device's lock. */
    bool active;                 /* an event is running on some thread */
    uint64_t generation;         /* bumped when an event ends */
    pthread_cond_t done;         /* signalled when an event ends */
    uint64_t events, waits, callback_runs, recovered_bytes;
    uint64_t wait_timeouts;      /* waits for another thread's event that gave up */
} shim_pressure_state;

void shim_pressure_state_init(shim_pressure_state *ps);
/* fork(): the child's state of a device (no event runs there). */
void shim_pressure_state_atfork_child(shim_pressure_state *ps);

enum shim_relief {
    SHIM_RELIEF_NONE,    /* nothing more will help (or another thread's event
                            outlasted the bound): fail the request */
    SHIM_RELIEF_RAN,     /* this thread ran an event: retry */
    SHIM_RELIEF_WAITED,  /* another thread's event ended: retry */
};

/* Entered with `lock` held after a request of `want` bytes failed. Runs one
 * pressure event (every callback, in registration order), or, when another
 * thread's event is running, waits for it to end, bounded by its progress
 * (progress.h; then SHIM_RELIEF_NONE). Returns with `lock` held.
 * The wait hooks run around that wait (a thread attached to Python detaches:
 * the event may need the GIL). */
enum shim_relief shim_pressure_relieve(shim_pressure_state *ps, spyreshim_lock *lock, size_t want);

/* Detaches the calling thread from whatever may need to run for another
 * thread's event to end (python_gc: the interpreter), returning a token, or
 * NULL when there was nothing to do; reattach(token) undoes it. Both are
 * called without the allocator lock. The upper layer registers them at init
 * (the allocator core knows nothing of Python). */
typedef void *(*shim_pressure_detach_fn)(void);
typedef void (*shim_pressure_reattach_fn)(void *token);
void shim_pressure_set_wait_hooks(shim_pressure_detach_fn detach, shim_pressure_reattach_fn reattach);

/* The trace registers this at init: called at the start of a pressure
 * event (begin = true, bytes = the request) and at its end (begin = false,
 * bytes = bytes freed meanwhile), with the device's allocator lock held;
 * it must only append to memory (no I/O, no lock but a leaf). */
typedef void (*shim_pressure_event_fn)(bool begin, size_t bytes);
void shim_pressure_set_event_hook(shim_pressure_event_fn fn);

/* Collections run for pressure events, as the leak layer sees them: the
 * collector (python_gc/gc/collect.c) calls shim_pressure_collection_begin
 * right before it runs the interpreter's collection and
 * shim_pressure_collection_end right after (GIL held, no shim lock held,
 * on the collecting thread), and they pass the boundary to the watch the
 * leak layer registers at init (shim/leak/collections.c): the allocator
 * core knows neither side. `ns` is the collection's time, `freed` the
 * bytes the shim saw freed during it, `objects` what the collector
 * returned. No watch: two relaxed loads. */
typedef void (*shim_pressure_collection_fn)(bool begin, uint64_t ns, uint64_t freed,
                                            long objects);
void shim_pressure_set_collection_watch(shim_pressure_collection_fn fn);
void shim_pressure_collection_begin(void);
void shim_pressure_collection_end(uint64_t ns, uint64_t freed, long objects);

/* The failure path (alloc_path.c): a request fails for good. True when a
 * collection run for pressure is in flight (it outlasted this request's
 * wait), with how long it has run; the bytes freed from now until the
 * collections in flight end are then its outcome (for the last such
 * failure): shim_pressure_failure_outcome says them once known. Atomics
 * only. */
bool shim_pressure_failed_during_collection(uint64_t *running_ns);
bool shim_pressure_failure_outcome(uint64_t *freed);

/* The policy gate: python_gc registers it at init. Asked once per relief
 * round of a failing request, before it runs or waits for a pressure event,
 * with NO allocator lock held (it may unwind the stack and ask the loader
 * who called); false means no pressure work for this request: it fails with
 * out-of-memory at once, and the framework's own retry runs. */
typedef bool (*shim_pressure_gate_fn)(size_t want);
void shim_pressure_set_gate(shim_pressure_gate_fn fn);

/* The CUDA hooks register this at init: true when the calling thread may
 * be inside a stream capture (docs/cuda.md). Asked like the gate, first:
 * during a capture no pressure work runs and the driver's answer stands
 * (a collection's frees and waits would be captured or invalidate it). */
typedef bool (*shim_pressure_capture_fn)(void);
void shim_pressure_set_capture_query(shim_pressure_capture_fn fn);
/* Requests refused by the capture query and by the gate, so far. */
uint64_t shim_pressure_capture_refusals(void);
uint64_t shim_pressure_gate_refusals(void);

/* True on a thread that is inside a pressure event (running callbacks, or
 * collecting on the shim's behalf): an allocation there must fail at once. */
bool shim_pressure_in_event(void);
/* Marks the calling thread as working for a pressure event (the GC thread). */
void shim_pressure_enter_service(void);
void shim_pressure_leave_service(void);

/* Called by a callback: retrying this request is pointless (a collection
 * timed out); the allocation fails with out-of-memory after this round. */
void shim_pressure_give_up(void);

/* fork(): the registry's lock, held across fork by the forking thread
 * (shim/process/fork.c). */
void shim_pressure_atfork_prepare(void);
void shim_pressure_atfork_parent(void);
void shim_pressure_atfork_child(void);

/* Every byte freed through the shim, all devices, monotonically: asked
 * of the allocator (device.c registers its sum when it makes a device). */
typedef uint64_t (*shim_pressure_freed_fn)(void);
void shim_pressure_set_freed_source(shim_pressure_freed_fn fn);
/* Watched memory charged to a limit and freed by the program, counted
 * with the allocator's frees: written by passthrough.c under its lock
 * only (a load and a store: no locked instruction on each free), read by
 * anyone. */
extern _Atomic uint64_t shim_pressure_watched_freed;
uint64_t shim_pressure_freed_total(void);

#endif
