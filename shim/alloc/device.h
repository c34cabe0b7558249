/* One device of an intercepted runtime (simdev, cuda:0, cuda:1, ...; with
 * CUDA, one live context of a device, see docs/cuda.md): its
 * arenas (one, and one more for each thread that found the others busy, up
 * to SPYRESHIM_ARENAS), each with its live table and lock, and the device
 * lock of its pressure events. The hooks in hooks/ call into here; nothing
 * here knows a runtime by name.
 *
 * A runtime may be reached by several routes (CUDA: the runtime library's
 * cudaMalloc and the driver's cuMemAlloc_v2, each a shim_runtime of its
 * own); routes with the same `name` share their devices, so an allocation
 * is served by one arena per device whatever route it took. */
#ifndef SHIM_DEVICE_H
#define SHIM_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "oomverdict.h"
#include "spyreshim.h"
#include "table.h"

/* A route into a runtime as the hooks describe it. Error numbers are the
 * runtime's. The real functions act on the device current on the calling
 * thread. */
typedef struct shim_runtime {
    const char *name;                     /* routes with one name share devices */
    int err_invalid;                      /* invalid value (1 for CUDA and simdev) */
    int err_oom;                          /* out of memory (2) */
    size_t alignment;                     /* block alignment, power of two >= 256 */
    int (*real_malloc)(void **ptr, size_t size);
    int (*real_free)(void *ptr);
    int (*real_mem_info)(size_t *free, size_t *total);
    /* Optional: the device current on the calling thread: its ordinal and
     * the context it is current in (an opaque nonzero key; 0 for a route
     * that knows no contexts). Returns 0, or the runtime's error (no
     * context). NULL: one device, 0, no context. Regions reserved in a
     * context belong to it: the driver frees them when it goes. */
    int (*current_device)(int *ordinal, uintptr_t *context);
    /* Optional, with current_device: the calling thread's context alone
     * (0, or the runtime's error), what most calls need to find their
     * device: current_device is asked only for a context not seen yet. */
    int (*current_context)(uintptr_t *context);
    /* Optional: waits until the work queued in `context` (0: on device
     * `ordinal`) before the call has run, without making any context that
     * does not exist. Returns 0, SHIM_SYNC_GONE when the context no longer
     * exists, or the runtime's error. Given, a freed block is kept aside
     * until such a wait on every live context of its device has covered it
     * (the runtime's free waits for the device; the shim's must not hand
     * the block out again before then). NULL: the runtime runs nothing
     * asynchronously, frees take effect at once. */
    int (*sync_device)(int ordinal, uintptr_t context);
    /* Optional: whether the calling thread may be inside a stream capture
     * (CUDA graphs), where a wait for the device or a region given back
     * would be captured or invalidate the capture: then the wait is
     * skipped (held.c: the blocks stay held) and cached regions stay
     * cached (the arena backend's may_release); the pressure event refuses
     * by its own capture query (docs/cuda.md, "Stream capture"). Slow
     * paths only. */
    bool (*in_capture)(void);
    /* Optional, with sync_device: the live contexts of device `ordinal`
     * the runtime knows of (made or retained by the program), at most
     * `max` into `out`; how many. A wait for the device waits for these
     * too, the shim served in them or not: work queued in any context of a
     * device may use a block of another (held.c). */
    size_t (*contexts_of)(int ordinal, uintptr_t *out, size_t max);
    /* Optional: whether the runtime itself holds a live allocation at
     * `addr`. Asked only for an address in a region forgotten at its
     * context's teardown, which the runtime may have given out again by a
     * route the shim does not serve (a stream-ordered pool's): then the
     * address is the runtime's, not a dead block of the shim's. */
    bool (*holds)(uintptr_t addr);
} shim_runtime;

/* sync_device: the context is gone (destroyed, reset): its memory with it. */
#define SHIM_SYNC_GONE (-1)

typedef struct shim_device shim_device;

/* Leak hunting registers these at init. `capture` records the calling
 * thread's stacks (ids, 0 = none) before the allocator lock is taken;
 * `on_oom` runs, without any allocator lock, when a request finally fails. */
typedef void (*shim_capture_fn)(uint32_t *native_stack, uint32_t *python_stack);
/* `facts`: why it failed (oomverdict.h), gathered on the failure path. */
typedef void (*shim_oom_fn)(const char *runtime, size_t size, const shim_oom_facts *facts);
void shim_device_set_leak_hooks(shim_capture_fn capture, shim_oom_fn on_oom);

/* The trace registers this at init (NULL while tracing is off). Called
 * after the allocator lock is released (the rare allocation made by a
 * pressure callback that still holds it excepted), once per successful
 * allocation, successful free and final out-of-memory, with the sequence
 * number taken inside the critical section: per device, seq orders events
 * exactly as the allocator saw them. `device` is the index of
 * shim_device_at; stacks are the allocation's ids (0 = none). */
/* Regions: SEGMENT_ALLOC/SEGMENT_FREE when one is reserved from the runtime
 * or given back (or forgotten at its context's teardown), called with the
 * arena's lock held; stacks 0. OOM: addr = the free bytes the runtime
 * reports at that moment, stacks = the failing request's. */
enum shim_event_kind {
    SHIM_EVENT_ALLOC = 1,
    SHIM_EVENT_FREE = 2,
    SHIM_EVENT_OOM = 3,
    SHIM_EVENT_SEGMENT_ALLOC = 4,
    SHIM_EVENT_SEGMENT_FREE = 5,
};
typedef void (*shim_event_fn)(enum shim_event_kind kind, unsigned device, uint64_t seq,
                              uintptr_t addr, size_t size, uint32_t native_stack,
                              uint32_t python_stack);
void shim_device_set_event_hook(shim_event_fn fn);
/* Takes the next sequence number (markers of other layers use it to place
 * themselves among the allocator's events). */
uint64_t shim_device_seq_next(void);


/* Device `ordinal` of `rt`'s runtime, created on first use. `rt` must
 * outlive the process (a static in the hook file). NULL when out of host
 * memory or past SHIM_MAX_DEVICES devices. */
shim_device *shim_device_get_ordinal(const shim_runtime *rt, int ordinal);
/* The same for the regions of `context` (0: none) on device `ordinal`: one
 * shim_device per live context. A device whose context was torn down is
 * taken again by the next context of its ordinal (same name). */
shim_device *shim_device_get_context(const shim_runtime *rt, int ordinal, uintptr_t context);
/* The runtime is about to free every allocation of `context` (the context
 * is destroyed or reset): the shim forgets that context's regions and
 * blocks, live, waiting for the device or free, without releasing any
 * (the runtime frees them), and waits for nothing. Counted in
 * context_teardown_blocks/_bytes; each live block is told to the trace as
 * freed. A later free of one of its addresses is answered as the runtime
 * answers a dead pointer. No allocator lock may be held by the caller. */
void shim_device_context_gone(const shim_runtime *rt, uintptr_t context);
/* A live device of `rt`'s runtime on device `ordinal` (a context the shim
 * serves there), the first made; NULL when there is none. For memory of a
 * device whose context is not the caller's (a pool or VMM allocation of
 * another device): counted and limited on that device. */
shim_device *shim_device_of_ordinal(const shim_runtime *rt, int ordinal);
/* The device current on the calling thread (rt->current_device). Returns
 * 0, the runtime's error when it has no current device, or err_oom when no
 * device can be created. */
int shim_device_for_caller(const shim_runtime *rt, shim_device **out);
/* shim_device_get_ordinal(rt, 0): runtimes with one device, tests. */
shim_device *shim_device_get(const shim_runtime *rt);
/* Returns the runtime's error numbers: 0, err_invalid or err_oom, or the
 * runtime's own error when it refused a region for another reason (no
 * driver, a stub library), at once and without pressure events. */
int shim_device_malloc(shim_device *d, void **ptr, size_t size);
/* The same in a region of its own, of the request's exact aligned size
 * (shim_arena_alloc_own): a block another process can map through an IPC
 * handle (shim_device_block_export). Counted, limited, tracked as any. */
int shim_device_malloc_own(shim_device *d, void **ptr, size_t size);
int shim_device_free(shim_device *d, void *ptr);
/* The same on the device current on the calling thread
 * (shim_device_for_caller's errors): the hooks of runtimes with a current
 * device, which then keep no device of their own and end in a tail call
 * (one frame less for every stack captured). */
int shim_device_malloc_current(const shim_runtime *rt, void **ptr, size_t size);
int shim_device_mem_info_current(const shim_runtime *rt, size_t *free_out, size_t *total_out);
/* Frees `ptr` whichever device of `rt`'s runtime served it, whatever device
 * is current (looked at first; `hint` when the runtime has one device, or
 * NULL); a pointer no device knows goes to rt->real_free. */
int shim_device_free_any(const shim_runtime *rt, shim_device *hint, void *ptr);
/* What the shim knows of an address of `rt`'s runtime. */
typedef struct shim_block_info {
    uintptr_t base;       /* the live block: its start */
    size_t size;          /*   the size the program asked for */
    uint64_t id;          /*   unique per block, never reused (its sequence number) */
    uintptr_t context;    /*   the context it was served in */
    int ordinal;          /*   its device */
} shim_block_info;
/* SHIM_BLOCK_LIVE: `addr` lies in a live block (*info filled);
 * SHIM_BLOCK_DEAD: in a region of the shim but in no live block (freed,
 * waiting for the device, slack), or in a region forgotten at its
 * context's teardown; SHIM_BLOCK_NONE: not the shim's. */
enum shim_block_state { SHIM_BLOCK_NONE = 0, SHIM_BLOCK_LIVE = 1, SHIM_BLOCK_DEAD = 2 };
enum shim_block_state shim_device_block_info(const shim_runtime *rt, uintptr_t addr,
                                             shim_block_info *info);
/* The live block of `rt`'s runtime that contains `addr`: 0 with its start
 * and the size the program asked for, or -1 when no device served it. */
int shim_device_block_range(const shim_runtime *rt, uintptr_t addr, uintptr_t *base,
                            size_t *size);
/* For an IPC handle: 0 when `addr` lies in a live block of `rt`'s
 * runtime that is alone in its region and starts it, *base its start (the
 * region is marked exported: once the block is freed it goes back to the
 * runtime, never to another block); -1 when the block shares its region
 * (or starts past its base), -2 when no live block holds `addr`. */
int shim_device_block_export(const shim_runtime *rt, uintptr_t addr, uintptr_t *base);
int shim_device_mem_info(shim_device *d, size_t *free, size_t *total);

/* "simdev" for a runtime with one device, "cuda:1" otherwise. */
const char *shim_device_name(const shim_device *d);
/* Bytes the program may have on it: the smaller of SPYRESHIM_LIMIT and the
 * runtime's total when it was first served; 0 when not known. Lock-free. */
uint64_t shim_device_capacity(const shim_device *d);
/* Devices created so far, in creation order (at most SHIM_MAX_DEVICES). */
#define SHIM_MAX_DEVICES 16
size_t shim_device_count(void);
shim_device *shim_device_at(size_t i);

/* Copies the records of live allocations with seq > since, under the lock.
 * Returns a malloc'ed array (caller frees) and its length in *n. */
shim_record *shim_device_live(shim_device *d, uint64_t since, size_t *n);
/* How long shim_device_live_timed held the arena locks: summed over the
 * holds and the longest one hold (the most an allocating thread can have
 * been stopped by it), in wall time and in the copying thread's CPU time
 * (which a busy machine's preemption does not inflate). */
typedef struct shim_live_timing {
    uint64_t held_ns, longest_ns;
    uint64_t held_cpu_ns, longest_cpu_ns;
} shim_live_timing;
/* shim_device_live, adding its holds to *t (sums added, longest kept),
 * for `spyreshim snapshot`. The copy is sized with no lock held. */
shim_record *shim_device_live_timed(shim_device *d, uint64_t since, size_t *n,
                                    shim_live_timing *t);
/* The sequence numbers of the live allocations only (no size, no stacks:
 * the table's slots and fields are read, not the blocks' nodes), appended
 * to the malloc'ed array *seqs of *n (grown as needed, *cap its capacity),
 * each arena's lock held for its part. -1 when out of host memory (the
 * array stays the caller's to free). What a collection left live
 * (shim/leak/collections.c). */
int shim_device_live_seqs(shim_device *d, uint64_t **seqs, size_t *n, size_t *cap);
/* Adds this device's counters to *s. Its peak_used_bytes is the device's
 * own peak: the process's is shim_device_peak_all's, not their sum. */
void shim_device_add_stats(shim_device *d, spyreshim_stats *s);
/* The peak of the live bytes of every device together, to within the
 * step each arena publishes in (1 MiB); never below one device's peak
 * or the bytes live now (the caller takes the largest). */
uint64_t shim_device_peak_all(void);
/* The peaks (each shard's, the device's, and with shim_device_peak_all_reset
 * the process's) restart from the bytes live now: spyreshim_reset_peak,
 * for the peak of one stretch of a program (a test). Each shard's lock
 * taken briefly. */
void shim_device_reset_peak(shim_device *d);
void shim_device_peak_all_reset(void);

/* True on a thread that is inside one of the shim's own calls of a real
 * runtime function (reserving or releasing a region, asking for memory
 * info, waiting for a device). A runtime reached by two routes calls the
 * other route's entry points from inside (the CUDA runtime's cudaMalloc
 * calls the driver's cuMemAlloc_v2): the hooks pass those calls straight
 * to the real function, so the shim never serves its own reservations. */
bool shim_device_in_backend(void);

/* Allocation sequence: every successful allocation takes a number, and
 * every allocation that happens after this call takes one above what it
 * returns (a mark). Numbers grow along each thread; across threads they
 * follow time only while a trace is taken. */
uint64_t shim_device_seq_now(void);

/* fork() (the policy is shim/process/fork.c's). A device is announced
 * ready, once, after its runtime's first call returned, outside any lock:
 * that is when its fork handlers can be installed so that they run before
 * the runtime's own (docs/locking.md). prepare takes device i's lock,
 * parent and child release it; child_early, run before those, restarts the
 * lock of a device whose handlers were not installed yet. */
typedef void (*shim_device_ready_fn)(size_t index);
void shim_device_set_ready_hook(shim_device_ready_fn fn);
void shim_device_fork_prepare(size_t index);
void shim_device_fork_parent(size_t index);
void shim_device_fork_child(size_t index);
void shim_device_atfork_child_early(void);

/* The hook resolution lock: serializes a runtime's hooks publishing its
 * resolved entry points and creating its device (hooks/resolve.c), one lock
 * for every runtime. It lives here, below the hooks, because the fork
 * policy must take it: a thread publishing at fork() would otherwise leave
 * it held in the child, whose first call into that runtime then waits
 * forever. Never held across a loader call. prepare takes it, parent and
 * child release it (docs/locking.md). */
void shim_device_publish_lock(void);
void shim_device_publish_unlock(void);
/* Asks the runtime, once, what the device holds in all (the trace's
 * capacity record): done by shim_device_get_context on the thread that
 * creates the device, unless that thread deferred it (it holds the
 * publish lock, publish.c), which calls this after releasing it.
 * Idempotent. */
void shim_device_learn_capacity(shim_device *d);
void shim_device_defer_capacity(bool on);
void shim_device_publish_atfork_prepare(void);
void shim_device_publish_atfork_parent(void);
void shim_device_publish_atfork_child(void);

#endif
