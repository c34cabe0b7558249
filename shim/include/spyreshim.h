/* spyreshim public API.
 *
 * libspyreshim.so is meant to be preloaded (LD_PRELOAD); code that wants to
 * talk to it (a framework's allocator, a test harness) includes this header
 * and links with -lspyreshim, or looks the functions up with dlsym so that it
 * still runs when the shim is absent.
 */
#ifndef SPYRESHIM_H
#define SPYRESHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPYRESHIM_VERSION_MAJOR 0
#define SPYRESHIM_VERSION_MINOR 1

#if defined(SPYRESHIM_BUILDING)
#define SPYRESHIM_API __attribute__((visibility("default")))
#else
#define SPYRESHIM_API
#endif

/* The allocator lock as seen by a pressure callback. */
typedef struct spyreshim_lock spyreshim_lock;

/* A pressure callback is entered with the allocator lock held. It must call
 * spyreshim_lock_release() before anything that can block (the GIL, I/O,
 * another allocator, waiting for a thread) and spyreshim_lock_acquire()
 * before returning. Debug builds abort if it returns without the lock.
 * Device memory may be freed from inside the callback (or from finalizers
 * it triggers), on any thread. An allocation made while a pressure event is
 * running on the same thread starts no event of its own: it fails with
 * out-of-memory instead of recursing (on CUDA, after the wait for the
 * device that a request finding no free block makes first). `bytes_wanted` is the size of the request that failed. */
typedef void (*spyreshim_pressure_fn)(spyreshim_lock *lock, size_t bytes_wanted,
                                      void *user);

/* Returns 0, or -1 when the table is full or `fn` is NULL. The same
 * (fn, user) pair may be registered once; registering it again is a no-op. */
SPYRESHIM_API int spyreshim_register_pressure_callback(spyreshim_pressure_fn fn, void *user);
/* Returns 0, or -1 when (fn, user) was not registered. Called outside the
 * callback, returns only once that callback stopped running on every thread
 * (`user` may be freed then). Safe to call from inside the callback itself,
 * which then does not wait for itself. Do not call it with the allocator
 * lock held for a callback other than the one running (it may wait for a
 * run on another thread that needs that lock). */
SPYRESHIM_API int spyreshim_unregister_pressure_callback(spyreshim_pressure_fn fn, void *user);

SPYRESHIM_API void spyreshim_lock_release(spyreshim_lock *lock);
SPYRESHIM_API void spyreshim_lock_acquire(spyreshim_lock *lock);

/* Counters summed over every intercepted runtime. `size` must be set to
 * sizeof(spyreshim_stats) by the caller, so the struct can grow (new fields
 * are added at the end only). The one list of the fields: it makes the
 * struct and the SPYRESHIM_STATS JSON, and the Python package's list is
 * tested against it. */
#define SPYRESHIM_STATS_FIELDS(X)                                                  \
    X(reserved_bytes, "bytes held from the runtime now")                           \
    X(used_bytes, "bytes handed out to the program now")                           \
    X(peak_reserved_bytes, "most bytes ever held from the runtime")                \
    X(peak_used_bytes, "most bytes ever handed out")                               \
    X(allocs, "successful allocations")                                            \
    X(frees, "frees of the shim's blocks")                                         \
    X(failed_allocs, "out-of-memory returned to the program")                      \
    X(regions, "regions held now")                                                 \
    X(regions_reserved, "regions ever reserved")                                   \
    X(regions_released, "regions given back")                                      \
    X(invalid_frees, "double frees, interior pointers, wild pointers")             \
    X(foreign_frees, "pointers the shim never handed out, passed to the runtime")  \
    X(pressure_events, "pressure events run")                                      \
    X(pressure_waits, "waits for another thread's pressure event")                 \
    X(callback_runs, "pressure callback invocations")                              \
    X(callback_recovered_bytes, "bytes freed while callbacks ran")                 \
    X(gc_collections, "garbage collections run under pressure")                    \
    X(gc_time_ns, "time inside those collections")                                 \
    X(gc_recovered_bytes, "device bytes freed while collecting")                   \
    X(gc_timeouts, "requests that stopped waiting for the GC thread")             \
    X(gc_skipped, "pressure events with no collection (not initialized, ...)")    \
    X(gc_backoff_skips, "pressure events skipped by the back-off")                 \
    X(device_waits, "waits for a device before reusing blocks freed while in use") \
    X(pressure_wait_timeouts, "requests that stopped waiting for another thread's pressure event") \
    X(arenas, "arenas serving allocations now, all devices (SPYRESHIM_ARENAS)")     \
    X(context_teardown_blocks, "live blocks freed by their context's teardown")     \
    X(context_teardown_bytes, "bytes of those blocks")                             \
    X(managed_bytes, "managed memory live now (passed through, all devices)")      \
    X(managed_allocs, "managed allocations (cuMemAllocManaged)")                   \
    X(managed_frees, "frees of managed allocations")                               \
    X(host_pinned_bytes, "host-pinned memory live now (allocated or registered)")  \
    X(host_pinned_allocs, "host-pinned allocations and registrations")             \
    X(host_pinned_frees, "frees and unregistrations of host-pinned memory")        \
    X(vmm_bytes, "VMM physical memory live now (cuMemCreate, all devices)")        \
    X(vmm_allocs, "VMM physical allocations (cuMemCreate)")                        \
    X(vmm_frees, "VMM physical allocations freed (released and unmapped)")        \
    X(async_bytes, "stream-ordered memory the program holds now (cuMemAllocAsync)") \
    X(async_allocs, "stream-ordered allocations (cuMemAllocAsync, cuMemAllocFromPoolAsync)") \
    X(async_frees, "stream-ordered frees of them (cuMemFreeAsync)")

typedef struct spyreshim_stats {
    size_t size;
#define SPYRESHIM_STATS_FIELD_(name, doc) uint64_t name;
    SPYRESHIM_STATS_FIELDS(SPYRESHIM_STATS_FIELD_)
#undef SPYRESHIM_STATS_FIELD_
} spyreshim_stats;

SPYRESHIM_API int spyreshim_get_stats(spyreshim_stats *out);
/* peak_used_bytes restarts from the bytes in use now (every device), so
 * that it gives the peak of what follows (a test: the pytest plugin's
 * limit_memory). peak_reserved_bytes is left alone. */
SPYRESHIM_API void spyreshim_reset_peak(void);

/* The device peak of one thread: the bytes of the live blocks the calling
 * thread allocated (on any device the shim serves; freed by whichever
 * thread), and the most of them since its last reset. A thread is counted
 * from its first spyreshim_thread_reset_peak on: what it allocated before
 * is not counted, on its side or at its frees. spyreshim_thread_reset_peak
 * restarts the peak from the thread's bytes live now; it returns 0, or -1
 * when the thread could not be counted (65,535 counted threads alive, or
 * out of host memory). Until a thread's first reset, both readers give 0.
 * The pytest plugin's limit_memory(current_thread_only=True). */
SPYRESHIM_API int spyreshim_thread_reset_peak(void);
SPYRESHIM_API uint64_t spyreshim_thread_used(void);
SPYRESHIM_API uint64_t spyreshim_thread_peak(void);

/* Leak hunting. A mark is a point in the sequence of allocations. */
typedef uint64_t spyreshim_mark;
SPYRESHIM_API spyreshim_mark spyreshim_mark_now(void);

/* One live allocation in a snapshot. Stacks are interned ids, resolved by
 * spyreshim_snapshot_write_json / spyreshim_snapshot_print. */
typedef struct spyreshim_alloc_info {
    uintptr_t ptr;
    size_t size;
    uint64_t seq;            /* allocation sequence number (marks compare with it) */
    uint32_t native_stack;   /* 0: none recorded */
    uint32_t python_stack;   /* 0: none recorded */
    const char *runtime;     /* "simdev", "cuda"; "cuda-managed", "cuda-host-pinned", "cuda-vmm", "cuda-async" (watched); "opencl:0" for OpenCL's memory objects and SVM */
} spyreshim_alloc_info;

typedef struct spyreshim_snapshot spyreshim_snapshot;

/* Live allocations made after `since` (0: all of them). NULL on failure. */
SPYRESHIM_API spyreshim_snapshot *spyreshim_snapshot_take(spyreshim_mark since);
/* The same, of the blocks the calling thread allocated (freed by no thread
 * since) while it was counted (spyreshim_thread_reset_peak): the blocks
 * the shim serves, not memory it passes through and watches. Empty when
 * the thread is not counted. */
SPYRESHIM_API spyreshim_snapshot *spyreshim_snapshot_take_thread(spyreshim_mark since);
SPYRESHIM_API size_t spyreshim_snapshot_count(const spyreshim_snapshot *s);
SPYRESHIM_API uint64_t spyreshim_snapshot_bytes(const spyreshim_snapshot *s);
SPYRESHIM_API const spyreshim_alloc_info *spyreshim_snapshot_get(const spyreshim_snapshot *s, size_t i);
/* Grouped by stack, largest first, LeakSanitizer-style; `max_groups` 0 = all. */
SPYRESHIM_API int spyreshim_snapshot_print(const spyreshim_snapshot *s, int fd, size_t max_groups);
/* The report JSON format of SPYRESHIM_REPORT. Returns 0 or -1 (errno set). */
SPYRESHIM_API int spyreshim_snapshot_write_json(const spyreshim_snapshot *s, const char *path);
SPYRESHIM_API void spyreshim_snapshot_free(spyreshim_snapshot *s);

/* Work this thread's Python call hands to threads of a framework's own
 * (PyTorch's autograd engine runs backward() on a device thread without
 * Python frames): between begin and end, device allocations made by a
 * thread that runs no Python frame record this thread's Python stack at
 * begin as their origin (reports show it after their native frames and
 * label them by it), as long as no other such call runs at the same time
 * (with two, none is named). Call end once per begin, on any thread;
 * begin's value is for end. Cheap: one capture of the caller's stack. */
SPYRESHIM_API uint32_t spyreshim_origin_begin(void);
SPYRESHIM_API void spyreshim_origin_end(uint32_t token);

#ifdef __cplusplus
}
#endif
#endif
