/* What the stand-in's files share with each other (never exported: the
 * library is built with -fvisibility=hidden and only CUAPI functions leave
 * it). Each declaration names the file that owns it. */
#ifndef CUDADRV_INTERNAL_H
#define CUDADRV_INTERNAL_H

#include "cudadrv.h"

#include <stdbool.h>
#include <stdint.h>

#define CD_MAX_DEVICES 16

/* ---- options.c: CUDASTANDIN_* read once, at cuInit ---------------------- */
struct cd_options {
    int devices;
    size_t memory[CD_MAX_DEVICES];
    unsigned op_delay_us;
};
void cd_options_read(struct cd_options *out);

/* ---- init.c ------------------------------------------------------------- */
extern struct cd_options cd_opts;
/* CUDA_SUCCESS once cuInit succeeded, else CUDA_ERROR_NOT_INITIALIZED. */
CUresult cd_ready(void);
#define CD_REQUIRE_INIT() do { CUresult r_ = cd_ready(); if (r_) return r_; } while (0)
bool cd_device_valid(CUdevice dev);

/* ---- memory.c: per-device address ranges and allocators ------------------ */
bool cd_memory_init(void);
/* A block: where [ptr, ptr+len) lies, if inside one live allocation. */
struct cd_block {
    CUdevice dev;
    CUdeviceptr base;
    size_t size;       /* as requested */
    CUcontext ctx;
    char *rw;          /* host view of `base` (read-write, only for copies) */
    unsigned long long id; /* buffer id: unique, never reused */
};
bool cd_memory_find(CUdeviceptr ptr, size_t len, struct cd_block *out);
/* Physical memory allocated outside the heaps (vmm.c's cuMemCreate):
 * counted in the device's used bytes; false when it does not fit. */
bool cd_memory_charge(CUdevice dev, size_t size);
void cd_memory_uncharge(CUdevice dev, size_t size);
/* vmm.c: a mapped range of a reservation that holds [ptr, ptr+len) (no
 * context: ctx NULL), and whether copies from device `dev` may touch it
 * (true for addresses no mapping covers). */
bool cd_vmm_find(CUdeviceptr ptr, size_t len, struct cd_block *out);
bool cd_vmm_accessible(CUdeviceptr ptr, size_t len, CUdevice dev);
/* [p, p+len) touches some device's address range (allocated or not). */
bool cd_memory_is_device(const void *p, size_t len);
CUresult cd_memory_alloc(CUcontext ctx, size_t size, CUdeviceptr *out);
/* The same on device `dev`, owned by `ctx` (NULL: by no context, as a
 * stream-ordered pool's memory: a context's teardown leaves it). */
CUresult cd_memory_alloc_on(CUdevice dev, CUcontext ctx, size_t size, CUdeviceptr *out);
/* Frees the block starting at ptr after the device went idle. */
CUresult cd_memory_free(CUdeviceptr ptr);
void cd_memory_free_context(CUcontext ctx);
void cd_memory_info(CUdevice dev, size_t *free_bytes, size_t *total);
size_t cd_memory_capacity(CUdevice dev);

/* Frees the block starting at ptr now, without waiting (a stream-ordered
 * free, run by the stream's worker once the stream got there). */
CUresult cd_memory_free_now(CUdeviceptr ptr);

/* Buffer ids: unique, never reused (imports take theirs here too). */
unsigned long long cd_memory_next_id(void);
/* What an importer needs to find an allocation's bytes (ipc.c makes the
 * handle from it): the device's memfd in the exporter (its descriptor
 * number there and the process's token, part of the file's name), the
 * allocation's offset in it, its size and buffer id. */
struct cd_export {
    int dev;
    int fd;
    unsigned long long token;
    size_t off;
    size_t size;
    unsigned long long id;
    size_t slot;       /* where its export slot lies in the file */
};
/* Marks the allocation that holds ptr exported. CUDA_ERROR_INVALID_VALUE
 * when ptr is in no live allocation; CUDA_ERROR_NOT_SUPPORTED when its
 * bytes cannot be shared (a forked child's copy). */
CUresult cd_memory_export(CUdeviceptr ptr, struct cd_export *out);
size_t cd_memory_page_size(void);

/* ---- ipc.c: the importer's side of IPC ---------------------------------- */
/* An opened handle's range (cd_memory_find falls back to it). */
bool cd_ipc_find(CUdeviceptr ptr, size_t len, struct cd_block *out);
/* [a, e) touches an opened handle's range. */
bool cd_ipc_is_device(uintptr_t a, uintptr_t e);
/* The context goes: its opened handles are closed. */
void cd_ipc_drop_context(CUcontext ctx);

/* ---- host.c: pinned, registered and managed host memory ----------------- */
enum cd_host_kind { CD_HOST_PINNED, CD_HOST_REGISTERED, CD_HOST_MANAGED };
struct cd_host {
    char *base;
    size_t size;
    enum cd_host_kind kind;
    CUcontext ctx;
};
bool cd_host_find(const void *p, struct cd_host *out);
/* cuMemFree of managed memory: true when ptr was one. */
bool cd_host_free_managed(CUdeviceptr ptr);
/* Whether ptr is the start of a managed allocation. */
bool cd_host_is_managed(CUdeviceptr ptr);
/* The context is torn down: its managed memory goes with it. */
void cd_host_free_context(CUcontext ctx);

/* ---- context.c: contexts and the per-thread stack ----------------------- */
/* The current context if it is alive, else NULL. */
CUcontext cd_context_current(void);
/* CUDA_SUCCESS and *out, or CUDA_ERROR_INVALID_CONTEXT. */
CUresult cd_context_require(CUcontext *out);
CUdevice cd_context_device(CUcontext ctx);
bool cd_context_alive(CUcontext ctx);

/* ---- stream.c: queues, worker threads, ordering ------------------------- */
/* A point in a stream: done once `seq` operations of it have completed.
 * Holds a reference on the stream (cd_mark_release drops it). */
struct cd_mark {
    struct cd_stream *s;
    uint64_t seq;
};
typedef void (*cd_work_fn)(void *arg);
/* Queues fn(arg) (fn may be NULL: an operation that only waits) on h (NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD mean
 * the current context's legacy stream). fn runs on the stream's worker and
 * owns arg; on failure fn never runs and arg stays the caller's. `after`
 * (may be NULL) is an extra dependency; `done` (may be NULL) receives the
 * point right after this operation. */
CUresult cd_stream_enqueue(CUstream h, cd_work_fn fn, void *arg,
                           const struct cd_mark *after, struct cd_mark *done);
/* Blocks until the point is reached. */
void cd_mark_wait(const struct cd_mark *m);
bool cd_mark_reached(const struct cd_mark *m);
void cd_mark_copy(struct cd_mark *dst, const struct cd_mark *src);
void cd_mark_release(struct cd_mark *m);
/* Waits for every queued operation on the device / of the context. */
void cd_device_synchronize(CUdevice dev);
void cd_context_synchronize(CUcontext ctx);
/* Destroys the context's streams (it is being destroyed). */
void cd_streams_drop_context(CUcontext ctx);
/* Whether h names a live stream other than a default one; *ctx and
 * *nonblocking describe it. */
bool cd_stream_describe(CUstream h, CUcontext *ctx, bool *nonblocking);

/* ---- capture.c: stream capture and the threads' capture modes ----------- */
/* An operation that is not permitted during a capture (cuMemAlloc, ...) is
 * about to run on this thread: true (and the captures it conflicts with
 * invalidated) when the driver refuses it with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED. */
bool cd_capture_refuses_unsafe_call(void);
/* A synchronizing call (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize, cuMemFree) is called: counted when any capture is
 * live, whether it then waits or is refused (cudastandinSyncsDuringCapture,
 * for tests). */
void cd_capture_note_sync(void);

/* ---- mempool.c: stream-ordered pools ------------------------------------ */
/* A synchronization point: every pool gives back the memory of completed
 * frees above its release threshold, as the driver does. */
void cd_mempool_sync_point(void);
/* Whether ptr is a pool's chunk, live or freed (cuMemFree refuses it). */
bool cd_mempool_owns(CUdeviceptr ptr);

#endif
