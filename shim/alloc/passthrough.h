/* Allocations the shim passes through to the runtime and only watches
 * (passthrough.c): CUDA managed, host-pinned, VMM and stream-ordered
 * memory; every OpenCL memory object and SVM allocation. */
#ifndef SHIM_PASSTHROUGH_H
#define SHIM_PASSTHROUGH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pool.h"

enum shim_pt_family {
    SHIM_PT_MANAGED,     /* cuMemAllocManaged: counted on its device */
    SHIM_PT_HOST_PINNED, /* cuMemHostAlloc, cuMemAllocHost, cuMemHostRegister */
    SHIM_PT_VMM,         /* cuMemCreate's physical allocations, keyed by handle */
    SHIM_PT_ASYNC,       /* cuMemAllocAsync, cuMemAllocFromPoolAsync: held by the program */
    SHIM_PT_OPENCL_MEM,  /* every OpenCL memory object (buffers, images, pipes), keyed by cl_mem */
    SHIM_PT_OPENCL_SVM,  /* clSVMAlloc */
    SHIM_PT_FAMILIES
};

/* The family's name in statistics and leak reports: "cuda-managed",
 * "cuda-host-pinned", "cuda-vmm", "cuda-async", "opencl", "opencl-svm". */
const char *shim_passthrough_family_name(enum shim_pt_family f);

/* The leak room's stack capture (set by shim_leak_init; NULL: no stacks). */
typedef void (*shim_pt_capture_fn)(uint32_t *native_stack, uint32_t *python_stack);
void shim_passthrough_set_capture(shim_pt_capture_fn fn);

/* The trace's hook (set by shim_trace_init): each allocation (alloc true)
 * and free, with the sequence number taken under the table's lock and the
 * allocation's stacks. `device`: the index (shim_device_at) of the device
 * a family traced as its device's own memory (OpenCL's: the runtime has
 * no other) is on, else -1 (the family's pseudo-device). Called with no
 * shim lock held. */
typedef void (*shim_pt_event_fn)(bool alloc, enum shim_pt_family f, int device, uint64_t seq,
                                 uintptr_t ptr, size_t size, uint32_t native_stack,
                                 uint32_t python_stack);
void shim_passthrough_set_event_hook(shim_pt_event_fn fn);
/* The trace's hook for a stream-ordered pool's trim (cuMemPoolTrimTo):
 * the pool's handle and the bytes it gave back to the device. */
typedef void (*shim_pt_trim_fn)(uint64_t seq, uintptr_t pool, size_t released);
void shim_passthrough_set_trim_hook(shim_pt_trim_fn fn);
/* A pool of family SHIM_PT_ASYNC gave `released` bytes back (trace only:
 * the program's live bytes, what the family counts, do not change). */
void shim_passthrough_pool_trimmed(uintptr_t pool, size_t released);

/* The runtime returned `ptr` (`size` bytes, on device `ordinal`, -1 for
 * host memory): record it with the caller's stack. No shim lock may be
 * held by the caller. */
void shim_passthrough_add(enum shim_pt_family f, int ordinal, uintptr_t ptr, size_t size);
/* The limit (charge.c). A family counted on a device is charged to that
 * device's SPYRESHIM_LIMIT, the pool its served regions share, before the
 * runtime is asked: 0, or the runtime's out-of-memory error (err_oom) when
 * the limit has no room even after the device's held blocks, trimmed
 * regions and a pressure event (room.c, under the capture and gate
 * policy). The caller holds no shim lock. Given back with uncharge when
 * the runtime refuses the request (a record made with add_charged gives it
 * back itself when removed or dropped). */
typedef struct shim_device shim_device;
int shim_passthrough_charge(shim_device *d, size_t bytes);
void shim_passthrough_uncharge(shim_device *d, size_t bytes);
/* The same for host-pinned memory, under SPYRESHIM_HOST_LIMIT (0: none),
 * with pressure events of its own: false when out of memory. */
bool shim_passthrough_charge_host(size_t bytes);
void shim_passthrough_uncharge_host(size_t bytes);
/* Host-pinned requests refused by SPYRESHIM_HOST_LIMIT so far. */
uint64_t shim_passthrough_host_failed(void);
/* d's device ordinal. */
int shim_passthrough_ordinal(const shim_device *d);
/* What a hook needs at hand to charge a device and record on it without
 * a call per step (a create path that costs a few hundred instructions
 * in the runtime: docs/opencl.md, "Cost"): the device's pool, ordinal and
 * index. Fixed for the device's life. */
struct shim_pt_counters;
typedef struct shim_pt_account {
    struct shim_arena_pool *pool;
    int ordinal, index;
    struct shim_pt_counters *row; /* passthrough.c's: the device's counters */
} shim_pt_account;
shim_pt_account shim_passthrough_account(shim_device *d);
/* The same from its parts (charge.c's: the records never look at a
 * device). */
shim_pt_account shim_passthrough_account_of(int ordinal, int device,
                                            struct shim_arena_pool *pool);
/* add_pooled for an account's device and pool. Returns `ptr` (a hook's
 * return is then a jump). */
uintptr_t shim_passthrough_add_to(enum shim_pt_family f, const shim_pt_account *a,
                                  uintptr_t ptr, size_t size);
/* charge's first step, inline, for an account (a device's: its pool is
 * one): true when the bytes were charged while the limit had room, false
 * (nothing charged, no room made) otherwise. */
static inline bool shim_pt_account_take(const shim_pt_account *a, size_t limit, size_t bytes)
{
    return shim_pool_take_from(a->pool, limit, bytes);
}
/* fork(): the host account's lock and pressure state start anew in the
 * child (shim/process/fork.c). */
void shim_passthrough_charge_atfork_child(void);

/* shim_passthrough_add of memory charged to `d` (its ordinal), or, with
 * d NULL, to the host account (charge.c): removing or dropping the record
 * gives the bytes back. */
void shim_passthrough_add_charged(enum shim_pt_family f, shim_device *d, uintptr_t ptr,
                                  size_t size);
/* What add_charged does with the account's pool (NULL: none)
 * and the device's index (-1: none): passthrough.c knows pools, not
 * devices: the records never call back into the device. */
struct shim_arena_pool;
void shim_passthrough_add_pooled(enum shim_pt_family f, int ordinal, int device,
                                 struct shim_arena_pool *pool, uintptr_t ptr, size_t size);
/* The runtime freed every `f` allocation charged to `pool` (a device's:
 * its context was torn down): their records go, each told to the trace as
 * freed, and their bytes are given back. Returns how many there were. */
size_t shim_passthrough_drop_pool(enum shim_pt_family f, struct shim_arena_pool *pool);

/* The runtime freed `ptr` of family `f`: forget it. False when it was not
 * recorded (then nothing changes). */
bool shim_passthrough_remove(enum shim_pt_family f, uintptr_t ptr);
/* The program's references to a record (OpenCL's retain and release
 * counts; a record is made with one): retain adds one, false when `ptr`
 * is no live record of `f`; unref takes one from the newest record of
 * `ptr` and, at the last, removes it as remove does. Returns the
 * references left (0: removed), or -1 when `ptr` is no live record.
 * Unlike the others, unref and add_to take `f` as given: a family
 * (shim_pt_family), from the hooks' constants, without a check on each
 * release and creation. */
bool shim_passthrough_retain(enum shim_pt_family f, uintptr_t ptr);
/* unref told after the runtime's release, with shim_passthrough_order()
 * read before it: the runtime may have freed the object meanwhile and
 * another thread made a new one at its address, recorded since; the
 * record that loses a reference is the newest of those recorded before
 * the read. So a hook calls the runtime first, and the shim's look-up
 * overlaps the runtime's work (docs/opencl.md, "Cost"). */
extern _Atomic uint32_t shim_pt_order;
static inline uint32_t shim_passthrough_order(void)
{
    return atomic_load_explicit(&shim_pt_order, memory_order_relaxed);
}
long shim_passthrough_unref_before(enum shim_pt_family f, uintptr_t ptr, uint32_t order);
/* unref told now (no runtime call in between). */
static inline long shim_passthrough_unref(enum shim_pt_family f, uintptr_t ptr)
{
    return shim_passthrough_unref_before(f, ptr, shim_passthrough_order());
}
/* Mappings of a record (VMM's only: a physical allocation lives while its
 * handle is not released or a mapping uses it). mapped: `ptr` was mapped
 * at [va, va + size) (a handle may be mapped at several addresses; a leak
 * report names the last one mapped that is still live). unmapped: the
 * mappings starting in [va, va + size) went, of every record; records
 * released before and now unmapped are removed (as by remove); returns how
 * many were. release: one reference of the handle goes (its creation's,
 * or a retain's): the record is removed when none is left and nothing
 * maps it, else kept (still live, still charged) until then; false when
 * `ptr` is no live record of `f`. */
void shim_passthrough_mapped(enum shim_pt_family f, uintptr_t ptr, uintptr_t va, size_t size);
size_t shim_passthrough_unmapped(enum shim_pt_family f, uintptr_t va, size_t size);
bool shim_passthrough_release(enum shim_pt_family f, uintptr_t ptr);
/* One more reference of handle `ptr` (cuMemRetainAllocationHandle): each
 * is released (release) before the record can go. */
void shim_passthrough_retained(enum shim_pt_family f, uintptr_t ptr);
/* Whether `ptr` is a live record of `f`. */
bool shim_passthrough_contains(enum shim_pt_family f, uintptr_t ptr);
/* Whether any record of `f` is live: one relaxed load, inline, for hot
 * paths (cuMemFree_v2) that must not look further when none is. */
extern _Atomic uint64_t shim_pt_live_count[SHIM_PT_FAMILIES];
static inline bool shim_passthrough_any(enum shim_pt_family f)
{
    return atomic_load_explicit(&shim_pt_live_count[f], memory_order_relaxed) != 0;
}

/* Counters of one family on one device (ordinal -1: host). */
typedef struct shim_pt_counters {
    uint64_t bytes, peak_bytes, allocs, frees;
} shim_pt_counters;
/* Totals of family `f` over all devices. */
void shim_passthrough_totals(enum shim_pt_family f, shim_pt_counters *out);
/* Calls `fn` for each (family, device) that ever had an allocation. */
void shim_passthrough_each(void (*fn)(void *arg, enum shim_pt_family f, int ordinal,
                                      const shim_pt_counters *c),
                           void *arg);

/* A live record, as copied by shim_passthrough_live. The fields a free
 * reads come first: with the table's link they share one cache line of
 * the record's node (passthrough.c), the one miss of a free. */
typedef struct shim_pt_record {
    uintptr_t ptr;
    uint64_t size;
    uint32_t refs;                   /* the program's references (retain/unref) */
    uint32_t order;                  /* passthrough.c's: when it went in (wrapping) */
    struct shim_arena_pool *charged; /* the account's pool charged, or NULL */
    enum shim_pt_family family;
    int ordinal;
    uint64_t seq;
    uint32_t native_stack, python_stack;
    int device;                      /* its device's index (shim_device_at), or -1 */
    uintptr_t va;                    /* where it is mapped (VMM), or 0 */
    uint64_t va_size;
    unsigned maps;                   /* live mappings (where: passthrough.c) */
    bool released;                   /* its handle went; it lives while mapped */
} shim_pt_record;
/* A malloc'd copy of the live records allocated after `since` (their
 * count in *n); NULL with *n = 0 when there are none, NULL with *n > 0
 * when out of host memory. */
shim_pt_record *shim_passthrough_live(uint64_t since, size_t *n);
/* The device a live record is reported on (its index), or -1 for a
 * family reported under its own name (shim_passthrough_family_name). */
int shim_passthrough_reported_device(const shim_pt_record *r);
/* Whether anything was ever recorded (the at-exit reports' "touched"). */
bool shim_passthrough_used(void);

void shim_passthrough_atfork_prepare(void);
void shim_passthrough_atfork_parent(void);
void shim_passthrough_atfork_child(void);

#endif
