/* One intercepted runtime (simdev, CUDA, ...): its real entry points, its
 * arena, its live table, and the allocator lock that guards both. The hooks
 * in hooks/ call into here; nothing here knows a runtime by name. */
#ifndef SHIM_DEVICE_H
#define SHIM_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "spyreshim.h"
#include "table.h"

/* A runtime as the hooks describe it. Error numbers are the runtime's. */
typedef struct shim_runtime {
    const char *name;
    int err_invalid;                      /* invalid value (1 for CUDA and simdev) */
    int err_oom;                          /* out of memory (2) */
    size_t alignment;                     /* block alignment, power of two >= 256 */
    int (*real_malloc)(void **ptr, size_t size);
    int (*real_free)(void *ptr);
    int (*real_mem_info)(size_t *free, size_t *total);
} shim_runtime;

typedef struct shim_device shim_device;

/* Leak hunting registers these at init. `capture` records the calling
 * thread's stacks (ids, 0 = none) before the allocator lock is taken;
 * `on_oom` runs, without any allocator lock, when a request finally fails. */
typedef void (*shim_capture_fn)(uint32_t *native_stack, uint32_t *python_stack);
typedef void (*shim_oom_fn)(const char *runtime, size_t size);
void shim_device_set_leak_hooks(shim_capture_fn capture, shim_oom_fn on_oom);

/* The device for `rt`, created on first use. `rt` must outlive the process
 * (a static in the hook file). Never NULL unless out of host memory. */
shim_device *shim_device_get(const shim_runtime *rt);
/* Returns the runtime's error numbers: 0, err_invalid or err_oom, or the
 * runtime's own error when it refused a region for another reason (no
 * driver, a stub library), at once and without pressure events. */
int shim_device_malloc(shim_device *d, void **ptr, size_t size);
int shim_device_free(shim_device *d, void *ptr);
int shim_device_mem_info(shim_device *d, size_t *free, size_t *total);

const char *shim_device_name(const shim_device *d);
/* Devices created so far, in creation order (at most SHIM_MAX_DEVICES). */
#define SHIM_MAX_DEVICES 8
size_t shim_device_count(void);
shim_device *shim_device_at(size_t i);

/* Copies the records of live allocations with seq > since, under the lock.
 * Returns a malloc'ed array (caller frees) and its length in *n. */
shim_record *shim_device_live(shim_device *d, uint64_t since, size_t *n);
/* Adds this device's counters to *s. */
void shim_device_add_stats(shim_device *d, spyreshim_stats *s);
/* Gives every empty region back to the runtime; returns bytes. */
size_t shim_device_trim(shim_device *d);

/* Allocation sequence: every successful allocation takes the next number. */
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

/* Tests only: forget every device (the process keeps its memory). */
void shim_device_reset_for_tests(void);

#endif
