/* event: markers recorded into streams, with the time their turn came.
 *
 * An event remembers the mark of its latest record (stream.c) and, once
 * the worker reached it, a timestamp. `lock` guards every event's fields
 * and the registry of live events; it is never held while waiting for a
 * stream (marks are copied out first) and the worker's timestamp callback
 * takes it only briefly. A record is tagged with a generation so that a
 * late callback of an older record cannot overwrite a newer one's time;
 * generations are unique across all events, so a callback that outlived
 * its event (destroyed, its address reused) recognizes that too and never
 * touches freed memory. */
#include "internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct cd_event {
    struct cd_event *next;
    unsigned flags;
    bool recorded;
    bool stamped;
    uint64_t gen;
    double ms;                 /* CLOCK_MONOTONIC when the record ran */
    struct cd_mark mark;
};

struct stamp {
    struct cd_event *ev;
    uint64_t gen;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct cd_event *events;
static uint64_t last_gen;

/* lock held. */
static bool live(CUevent e)
{
    for (struct cd_event *x = events; x; x = x->next)
        if (x == e)
            return true;
    return false;
}

static void take_stamp(void *arg)
{
    struct stamp *st = arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&lock);
    if (live(st->ev) && st->ev->gen == st->gen) {
        st->ev->ms = ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
        st->ev->stamped = true;
    }
    pthread_mutex_unlock(&lock);
    free(st);
}

/* The event's latest mark, with a reference of the caller's own. */
static CUresult snapshot(CUevent e, struct cd_mark *m, bool *recorded)
{
    pthread_mutex_lock(&lock);
    if (!e || !live(e)) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *recorded = e->recorded;
    cd_mark_copy(m, &e->mark);
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!phEvent || (flags & ~(unsigned)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING
                                          | CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    /* An interprocess event must not time (cuda.h). */
    if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_VALUE;
    struct cd_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->flags = flags;
    pthread_mutex_lock(&lock);
    e->next = events;
    events = e;
    pthread_mutex_unlock(&lock);
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CD_REQUIRE_INIT();
    struct stamp *st = malloc(sizeof *st);
    if (!st)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    if (!hEvent || !live(hEvent)) {
        pthread_mutex_unlock(&lock);
        free(st);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    st->ev = hEvent;
    st->gen = hEvent->gen = ++last_gen;
    hEvent->stamped = false;
    struct cd_mark done = { 0 };
    CUresult rc = cd_stream_enqueue(hStream, take_stamp, st, NULL, &done);
    if (rc) {
        pthread_mutex_unlock(&lock);
        free(st);
        return rc;
    }
    struct cd_mark old = hEvent->mark;
    hEvent->mark = done;
    hEvent->recorded = true;
    pthread_mutex_unlock(&lock);
    cd_mark_release(&old);
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent)
{
    CD_REQUIRE_INIT();
    struct cd_mark m;
    bool recorded;
    CUresult rc = snapshot(hEvent, &m, &recorded);
    if (rc)
        return rc;
    bool done = !recorded || cd_mark_reached(&m);
    cd_mark_release(&m);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CD_REQUIRE_INIT();
    struct cd_mark m;
    bool recorded;
    CUresult rc = snapshot(hEvent, &m, &recorded);
    if (rc)
        return rc;
    cd_capture_note_sync();
    cd_mark_wait(&m);
    cd_mark_release(&m);
    cd_mempool_sync_point();
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int flags)
{
    CD_REQUIRE_INIT();
    if (flags > 1)             /* CU_EVENT_WAIT_DEFAULT, CU_EVENT_WAIT_EXTERNAL */
        return CUDA_ERROR_INVALID_VALUE;
    struct cd_mark m;
    bool recorded;
    CUresult rc = snapshot(hEvent, &m, &recorded);
    if (rc)
        return rc;
    /* An empty operation that waits for the mark holds back everything
     * queued on the stream after it. */
    rc = cd_stream_enqueue(hStream, NULL, NULL, recorded ? &m : NULL, NULL);
    cd_mark_release(&m);
    return rc;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CD_REQUIRE_INIT();
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_SUCCESS;
    if (!hStart || !hEnd || !live(hStart) || !live(hEnd))
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (!hStart->recorded || !hEnd->recorded)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (!hStart->stamped || !hEnd->stamped)
        rc = CUDA_ERROR_NOT_READY;
    else
        *pMilliseconds = (float)(hEnd->ms - hStart->ms);
    pthread_mutex_unlock(&lock);
    return rc;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CD_REQUIRE_INIT();
    pthread_mutex_lock(&lock);
    struct cd_event **p = &events;
    while (*p && *p != hEvent)
        p = &(*p)->next;
    if (!hEvent || !*p) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *p = hEvent->next;
    pthread_mutex_unlock(&lock);
    cd_mark_release(&hEvent->mark);
    free(hEvent);
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent)
{
    return cuEventDestroy_v2(hEvent);
}
