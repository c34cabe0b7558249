/* stream: queues of device work, one worker thread per stream, and the
 * ordering rules between them.
 *
 * An operation is a function the worker runs (a copy, a memset, an event's
 * timestamp), optionally after CUDASTANDIN_OP_DELAY_US, once its
 * dependencies are met. A dependency is a mark: "stream s has completed seq
 * operations". Ordering rules, as CUDA documents them for the legacy
 * default stream: an operation on a context's legacy stream waits for the
 * work already queued on every blocking stream of that context, and an
 * operation on a blocking stream waits for the work already queued on the
 * legacy stream; non-blocking streams order only by their own queue and
 * by cuStreamWaitEvent. The per-thread default stream (CU_STREAM_PER_THREAD
 * and the _ptsz/_ptds lookups) is served by the legacy stream: stronger
 * ordering than CUDA promises, never weaker.
 *
 * One mutex, `sched`, guards every stream's fields, the registry and all
 * marks' reference counts; one condition variable is broadcast whenever an
 * operation is queued or completes. Workers run operations without the
 * lock. A stream's struct lives as long as a mark or the registry refers to
 * it, so a mark never dangles after cuStreamDestroy. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct op {
    struct op *next;
    cd_work_fn fn;
    void *arg;
    size_t ndeps;
    struct cd_mark *deps;
};

struct cd_stream {
    struct cd_stream *next;    /* registry */
    CUcontext ctx;
    unsigned flags;
    bool legacy;
    bool dead;                 /* destroyed: the handle is no longer valid */
    bool stopping;             /* the worker exits once the queue is empty */
    int refs;
    uint64_t submitted, completed;
    struct op *head, *tail;
    pthread_t thread;
};

static pthread_mutex_t sched = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static struct cd_stream *streams;

/* sched held. */
static void unref(struct cd_stream *s)
{
    if (--s->refs == 0)
        free(s);
}

static bool reached(const struct cd_mark *m)
{
    return !m->s || m->s->completed >= m->seq;
}

static bool idle(const struct cd_stream *s)
{
    return s->completed == s->submitted;
}

static bool deps_met(const struct op *o)
{
    for (size_t i = 0; i < o->ndeps; i++)
        if (!reached(&o->deps[i]))
            return false;
    return true;
}

static void *worker(void *arg)
{
    struct cd_stream *s = arg;
    unsigned delay = cd_opts.op_delay_us;
    pthread_mutex_lock(&sched);
    for (;;) {
        while ((!s->head && !s->stopping) || (s->head && !deps_met(s->head)))
            pthread_cond_wait(&changed, &sched);
        if (!s->head)
            break;
        struct op *o = s->head;
        pthread_mutex_unlock(&sched);
        if (delay)
            usleep(delay);
        if (o->fn)
            o->fn(o->arg);
        pthread_mutex_lock(&sched);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->completed++;
        for (size_t i = 0; i < o->ndeps; i++)
            unref(o->deps[i].s);
        free(o->deps);
        free(o);
        pthread_cond_broadcast(&changed);
    }
    pthread_mutex_unlock(&sched);
    return NULL;
}

/* sched held. The registry holds one reference. */
static struct cd_stream *stream_new(CUcontext ctx, unsigned flags, bool legacy)
{
    struct cd_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ctx = ctx;
    s->flags = flags;
    s->legacy = legacy;
    s->refs = 1;
    if (pthread_create(&s->thread, NULL, worker, s)) {
        free(s);
        return NULL;
    }
    s->next = streams;
    streams = s;
    return s;
}

/* sched held. The context's legacy stream, made on first use. */
static struct cd_stream *legacy_of(CUcontext ctx, bool create)
{
    for (struct cd_stream *s = streams; s; s = s->next)
        if (s->ctx == ctx && s->legacy && !s->dead)
            return s;
    return create ? stream_new(ctx, 0, true) : NULL;
}

static bool is_default_handle(CUstream h)
{
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

/* sched held. The stream a handle means, or NULL with *rc set. */
static struct cd_stream *resolve(CUstream h, CUcontext current, CUresult *rc)
{
    if (is_default_handle(h)) {
        struct cd_stream *s = legacy_of(current, true);
        if (!s)
            *rc = CUDA_ERROR_OUT_OF_MEMORY;
        return s;
    }
    for (struct cd_stream *s = streams; s; s = s->next)
        if (s == h && !s->dead && !s->legacy)
            return s;
    *rc = CUDA_ERROR_INVALID_HANDLE;
    return NULL;
}

/* sched held. Appends to o->deps, taking a reference. */
static bool add_dep(struct op *o, struct cd_stream *s, uint64_t seq, size_t *cap)
{
    if (o->ndeps == *cap) {
        size_t ncap = *cap ? 2 * *cap : 4;
        struct cd_mark *n = realloc(o->deps, ncap * sizeof *n);
        if (!n)
            return false;
        o->deps = n;
        *cap = ncap;
    }
    o->deps[o->ndeps++] = (struct cd_mark){ s, seq };
    s->refs++;
    return true;
}

/* sched held. What an operation queued on s now must wait for besides s. */
static bool implicit_deps(struct op *o, struct cd_stream *s, size_t *cap)
{
    if (s->legacy) {
        for (struct cd_stream *b = streams; b; b = b->next)
            if (b->ctx == s->ctx && !b->legacy && !(b->flags & CU_STREAM_NON_BLOCKING)
                && !idle(b) && !add_dep(o, b, b->submitted, cap))
                return false;
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING)) {
        struct cd_stream *l = legacy_of(s->ctx, false);
        if (l && !idle(l) && !add_dep(o, l, l->submitted, cap))
            return false;
    }
    return true;
}

static void release_deps(struct op *o)
{
    for (size_t i = 0; i < o->ndeps; i++)
        unref(o->deps[i].s);
    free(o->deps);
}

CUresult cd_stream_enqueue(CUstream h, cd_work_fn fn, void *arg,
                           const struct cd_mark *after, struct cd_mark *done)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    struct op *o = calloc(1, sizeof *o);
    if (!o)
        return CUDA_ERROR_OUT_OF_MEMORY;
    o->fn = fn;
    o->arg = arg;
    size_t cap = 0;

    pthread_mutex_lock(&sched);
    struct cd_stream *s = resolve(h, ctx, &rc);
    if (!s)
        goto fail;
    if (!implicit_deps(o, s, &cap)
        || (after && !reached(after) && !add_dep(o, after->s, after->seq, &cap))) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        goto fail;
    }
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->submitted++;
    if (done) {
        done->s = s;
        done->seq = s->submitted;
        s->refs++;
    }
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&sched);
    return CUDA_SUCCESS;
fail:
    release_deps(o);
    pthread_mutex_unlock(&sched);
    free(o);
    return rc;
}

void cd_mark_wait(const struct cd_mark *m)
{
    pthread_mutex_lock(&sched);
    while (!reached(m))
        pthread_cond_wait(&changed, &sched);
    pthread_mutex_unlock(&sched);
}

bool cd_mark_reached(const struct cd_mark *m)
{
    pthread_mutex_lock(&sched);
    bool r = reached(m);
    pthread_mutex_unlock(&sched);
    return r;
}

void cd_mark_copy(struct cd_mark *dst, const struct cd_mark *src)
{
    pthread_mutex_lock(&sched);
    *dst = *src;
    if (dst->s)
        dst->s->refs++;
    pthread_mutex_unlock(&sched);
}

void cd_mark_release(struct cd_mark *m)
{
    pthread_mutex_lock(&sched);
    if (m->s)
        unref(m->s);
    pthread_mutex_unlock(&sched);
    m->s = NULL;
}

/* sched held. Every stream the predicate selects is idle. */
static bool all_idle(bool (*select)(const struct cd_stream *, const void *), const void *key)
{
    for (struct cd_stream *s = streams; s; s = s->next)
        if (select(s, key) && !idle(s))
            return false;
    return true;
}

static bool on_device(const struct cd_stream *s, const void *key)
{
    return cd_context_device(s->ctx) == *(const CUdevice *)key;
}

static bool in_context(const struct cd_stream *s, const void *key)
{
    return s->ctx == key;
}

void cd_device_synchronize(CUdevice dev)
{
    pthread_mutex_lock(&sched);
    while (!all_idle(on_device, &dev))
        pthread_cond_wait(&changed, &sched);
    pthread_mutex_unlock(&sched);
}

void cd_context_synchronize(CUcontext ctx)
{
    pthread_mutex_lock(&sched);
    while (!all_idle(in_context, ctx))
        pthread_cond_wait(&changed, &sched);
    pthread_mutex_unlock(&sched);
}

/* Lets the worker drain and exit, then unlinks the stream and drops the
 * registry's reference. Called with sched not held. */
static void stop(struct cd_stream *s)
{
    pthread_mutex_lock(&sched);
    s->stopping = true;
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&sched);
    pthread_join(s->thread, NULL);
    pthread_mutex_lock(&sched);
    for (struct cd_stream **p = &streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    unref(s);
    pthread_mutex_unlock(&sched);
}

void cd_streams_drop_context(CUcontext ctx)
{
    for (;;) {
        pthread_mutex_lock(&sched);
        struct cd_stream *s = streams;
        while (s && (s->ctx != ctx || s->dead))
            s = s->next;
        if (s)
            s->dead = true;
        pthread_mutex_unlock(&sched);
        if (!s)
            return;
        stop(s);
    }
}

/* ---- the API ------------------------------------------------------------- */

CUresult cuStreamCreate(CUstream *phStream, unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sched);
    struct cd_stream *s = stream_new(ctx, flags, false);
    pthread_mutex_unlock(&sched);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = s;
    return CUDA_SUCCESS;
}

/* Priorities only reorder work between streams on a real device; with one
 * worker per stream there is nothing to reorder. */
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    (void)priority;
    return cuStreamCreate(phStream, flags);
}

/* Returns once the stream's work has run: the real one returns at once and
 * releases the stream later, which no caller can tell apart. A stream is
 * its own handle: no context need be current (numba destroys its streams
 * after popping every context). */
CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CD_REQUIRE_INIT();
    if (is_default_handle(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&sched);
    struct cd_stream *s = resolve(hStream, NULL, &rc);
    if (s)
        s->dead = true;
    pthread_mutex_unlock(&sched);
    if (!s)
        return rc;
    stop(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    return cuStreamDestroy_v2(hStream);
}

static void noop(void *arg)
{
    (void)arg;
}

struct callback {
    CUstreamCallback fn;
    CUstream stream;
    void *user;
};

static void run_callback(void *arg)
{
    struct callback *c = arg;
    c->fn(c->stream, CUDA_SUCCESS, c->user);
    free(c);
}

/* The callback runs on the stream's worker once the work before it ran. */
CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData,
                             unsigned int flags)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    if (!callback || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct callback *c = malloc(sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct callback){ callback, hStream, userData };
    rc = cd_stream_enqueue(hStream, run_callback, c, NULL, NULL);
    if (rc)
        free(c);
    return rc;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    struct cd_mark m = { 0 };
    if (is_default_handle(hStream)) {
        /* The legacy stream's "all prior work" includes the blocking
         * streams' work: exactly what an empty operation queued on it
         * waits for. */
        rc = cd_stream_enqueue(hStream, noop, NULL, NULL, &m);
        if (rc)
            return rc;
    } else {
        pthread_mutex_lock(&sched);
        struct cd_stream *s = resolve(hStream, ctx, &rc);
        if (s) {
            m.s = s;
            m.seq = s->submitted;
            s->refs++;
        }
        pthread_mutex_unlock(&sched);
        if (!s)
            return rc;
    }
    cd_capture_note_sync();
    cd_mark_wait(&m);
    cd_mark_release(&m);
    cd_mempool_sync_point();
    return CUDA_SUCCESS;
}

CUresult cuStreamQuery(CUstream hStream)
{
    CUcontext ctx;
    CUresult rc = cd_context_require(&ctx);
    if (rc)
        return rc;
    pthread_mutex_lock(&sched);
    struct cd_stream *s = resolve(hStream, ctx, &rc);
    if (s) {
        bool done = idle(s);
        if (done && s->legacy)
            for (struct cd_stream *b = streams; b; b = b->next)
                if (b->ctx == s->ctx && !(b->flags & CU_STREAM_NON_BLOCKING) && !idle(b))
                    done = false;
        rc = done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
    }
    pthread_mutex_unlock(&sched);
    return rc;
}

bool cd_stream_describe(CUstream h, CUcontext *ctx, bool *nonblocking)
{
    if (is_default_handle(h))
        return false;
    bool found = false;
    pthread_mutex_lock(&sched);
    for (struct cd_stream *s = streams; s && !found; s = s->next) {
        if (s == h && !s->dead && !s->legacy) {
            *ctx = s->ctx;
            *nonblocking = (s->flags & CU_STREAM_NON_BLOCKING) != 0;
            found = true;
        }
    }
    pthread_mutex_unlock(&sched);
    return found;
}

/* The context a stream belongs to; the default streams' is the current
 * context (as the driver answers for them). */
CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    CD_REQUIRE_INIT();
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    bool nonblocking;
    if (is_default_handle(hStream))
        return cd_context_require(pctx);
    return cd_stream_describe(hStream, pctx, &nonblocking) ? CUDA_SUCCESS
                                                           : CUDA_ERROR_INVALID_HANDLE;
}
