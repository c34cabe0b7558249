/* capture: stream capture (cuStreamBeginCapture ... cuStreamEndCapture) and
 * each thread's capture mode (cuThreadExchangeStreamCaptureMode), as the
 * driver documents them. Nothing is recorded into a graph: work queued on
 * a capturing stream still runs (the stand-in tests allocators, not
 * graphs); what is modelled is who may call what during a capture:
 *
 * - a thread in CU_STREAM_CAPTURE_MODE_GLOBAL (the default) may not make a
 *   potentially unsafe call (here cuMemAlloc_v2) while it has a capture of
 *   its own not begun in relaxed mode, or while any thread has one begun in
 *   global mode; THREAD_LOCAL only minds its own; RELAXED never. The call
 *   fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 *   captures it conflicts with (their end answers
 *   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
 * - the legacy stream cannot be captured, and asking about it while a
 *   blocking stream of the context captures answers
 *   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
 * - a capture begun in global or thread-local mode ends on its own thread.
 *
 * - synchronizing calls (cuCtxSynchronize, cuMemFree) are potentially
 *   unsafe calls too; every synchronizing call made while any capture is
 *   live is counted, refused or not (cudastandinSyncsDuringCapture: a test's witness that
 *   an allocator never waited for the device while a capture ran).
 *
 * One mutex, `mu`, guards the list of captures; the mode is thread-local.
 * Never calls into stream.c with `mu` held (stream.c's lock comes first). */
#include "internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

struct capture {
    struct capture *next;
    CUstream stream;
    CUcontext ctx;
    bool blocking;
    CUstreamCaptureMode mode;
    pthread_t thread;
    cuuint64_t id;
    bool invalidated;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct capture *captures;
static cuuint64_t next_id = 1;
static unsigned long long syncs_during_capture;
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

static bool is_default(CUstream h)
{
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

/* mu held. */
static struct capture *find(CUstream h)
{
    for (struct capture *c = captures; c; c = c->next)
        if (c->stream == h)
            return c;
    return NULL;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    CUcontext cur;
    CUresult rc = cd_context_require(&cur);
    if (rc)
        return rc;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (is_default(hStream))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUcontext ctx;
    bool nonblocking;
    if (!cd_stream_describe(hStream, &ctx, &nonblocking))
        return CUDA_ERROR_INVALID_HANDLE;
    struct capture *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    if (find(hStream)) {
        pthread_mutex_unlock(&mu);
        free(c);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    *c = (struct capture){.next = captures, .stream = hStream, .ctx = ctx,
                          .blocking = !nonblocking, .mode = mode,
                          .thread = pthread_self(), .id = next_id++};
    captures = c;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* The first ABI (CUDA 10.0): no mode, global. */
CUresult cuStreamBeginCapture(CUstream hStream)
{
    return cuStreamBeginCapture_v2(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    CD_REQUIRE_INIT();
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct capture **pp = &captures;
    while (*pp && (*pp)->stream != hStream)
        pp = &(*pp)->next;
    struct capture *c = *pp;
    if (!c) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    *pp = c->next;
    pthread_mutex_unlock(&mu);
    bool invalid = c->invalidated;
    /* The graph: an opaque nonzero handle (no graph API here). */
    *phGraph = invalid ? NULL : (CUgraph)(uintptr_t)(c->id << 4);
    free(c);
    return invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

/* The status of hStream's capture; for a default stream, whether it would
 * join a blocking stream's capture in the current context. */
static CUresult status_of(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id)
{
    CUcontext cur;
    CUresult rc = cd_context_require(&cur);
    if (rc)
        return rc;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    if (!is_default(hStream)) {
        CUcontext ctx;
        bool nonblocking;
        if (!cd_stream_describe(hStream, &ctx, &nonblocking))
            return CUDA_ERROR_INVALID_HANDLE;
    }
    rc = CUDA_SUCCESS;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_lock(&mu);
    if (is_default(hStream) && hStream != CU_STREAM_PER_THREAD) {
        for (struct capture *c = captures; c; c = c->next)
            if (c->ctx == cur && c->blocking)
                rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else if (!is_default(hStream)) {
        struct capture *c = find(hStream);
        if (c) {
            *status = c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                     : CU_STREAM_CAPTURE_STATUS_ACTIVE;
            if (id)
                *id = c->id;
        }
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *status)
{
    return status_of(hStream, status, NULL);
}

CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *status, cuuint64_t *id)
{
    return status_of(hStream, status, id);
}

CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CD_REQUIRE_INIT();
    if (!mode || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

bool cd_capture_refuses_unsafe_call(void)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return false;
    bool refused = false;
    pthread_mutex_lock(&mu);
    for (struct capture *c = captures; c; c = c->next) {
        bool mine = pthread_equal(c->thread, pthread_self());
        bool conflicts = mine ? c->mode != CU_STREAM_CAPTURE_MODE_RELAXED
                              : thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                                    c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (conflicts) {
            c->invalidated = true;
            refused = true;
        }
    }
    pthread_mutex_unlock(&mu);
    return refused;
}

void cd_capture_note_sync(void)
{
    pthread_mutex_lock(&mu);
    if (captures)
        syncs_during_capture++;
    pthread_mutex_unlock(&mu);
}

/* Not a CUDA function: the tests' witness (see the top of this file). */
CUAPI unsigned long long cudastandinSyncsDuringCapture(void)
{
    pthread_mutex_lock(&mu);
    unsigned long long n = syncs_during_capture;
    pthread_mutex_unlock(&mu);
    return n;
}
