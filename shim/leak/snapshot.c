/* The public snapshot API (spyreshim.h): marks, snapshots of live
 * allocations, and their text and JSON forms.
 *
 * Owns nothing shared. A snapshot copies the live records of every device
 * (shim_device_live takes and drops each arena's lock in turn);
 * everything after that works on the copy, with no shim lock held, so
 * printing and symbolizing never delay an allocation. The interned names
 * of mapped VMM allocations are atomics (no lock).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "passthrough.h"
#include "path.h"
#include "report.h"
#include "snapshot.h"
#include "spyreshim.h"
#include "suppress.h"
#include "thread_live.h"

struct spyreshim_snapshot {
    spyreshim_alloc_info *allocs;
    size_t n;
    uint64_t bytes;
};

/* A mapped VMM allocation's runtime name says where it is mapped:
 * "cuda-vmm mapped at 0x7f0000000000+0x200000". Reports keep the runtime
 * names of a snapshot after freeing it, so the names are interned for the
 * process's life: at most LABELS of them (past that, the family's name
 * alone). No lock: a slot is taken with an atomic add and published, once
 * written, by its ready flag (two threads naming one range at once may
 * each take a slot: harmless). */
#define LABEL_LEN 64
#define LABELS 256
static char labels[LABELS][LABEL_LEN];
static _Atomic bool ready[LABELS];
static _Atomic size_t nlabels;

static const char *mapped_label(const char *family, uintptr_t va, uint64_t size)
{
    char want[LABEL_LEN];
    snprintf(want, sizeof want, "%s mapped at %#" PRIxPTR "+%#" PRIx64, family, va, size);
    size_t n = atomic_load(&nlabels);
    for (size_t i = 0; i < n && i < LABELS; i++)
        if (atomic_load_explicit(&ready[i], memory_order_acquire) && strcmp(labels[i], want) == 0)
            return labels[i];
    size_t slot = atomic_fetch_add(&nlabels, 1);
    if (slot >= LABELS)
        return family;
    memcpy(labels[slot], want, sizeof want);
    atomic_store_explicit(&ready[slot], true, memory_order_release);
    return labels[slot];
}

SPYRESHIM_API spyreshim_mark spyreshim_mark_now(void)
{
    return shim_device_seq_now();
}

SPYRESHIM_API spyreshim_snapshot *spyreshim_snapshot_take(spyreshim_mark since)
{
    return shim_snapshot_take_timed(since, NULL);
}

static spyreshim_snapshot *take(spyreshim_mark since, shim_live_timing *t, bool mine);

SPYRESHIM_API spyreshim_snapshot *spyreshim_snapshot_take_thread(spyreshim_mark since)
{
    return take(since, NULL, true);
}

spyreshim_snapshot *shim_snapshot_take_timed(spyreshim_mark since, shim_live_timing *t)
{
    return take(since, t, false);
}

/* `mine`: the blocks the calling thread allocated since it is counted
 * (thread_live.h) alone; none when it is not counted. */
static spyreshim_snapshot *take(spyreshim_mark since, shim_live_timing *t, bool mine)
{
    uint16_t slot = mine ? shim_tls_thread_slot : 0;
    if (t)
        memset(t, 0, sizeof *t);
    spyreshim_snapshot *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    size_t cap = 0;
    for (size_t d = 0; d < shim_device_count(); d++) {
        shim_device *dev = shim_device_at(d);
        if (!dev)
            continue;
        size_t k = 0;
        shim_record *recs = shim_device_live_timed(dev, since, &k, t);
        if (!recs && k) {
            spyreshim_snapshot_free(s);
            return NULL;
        }
        if (s->n + k > cap) {
            cap = (s->n + k) * 2;
            spyreshim_alloc_info *na = realloc(s->allocs, cap * sizeof *na);
            if (!na) {
                free(recs);
                spyreshim_snapshot_free(s);
                return NULL;
            }
            s->allocs = na;
        }
        const char *name = shim_device_name(dev);
        for (size_t i = 0; i < k; i++) {
            if (mine && (!slot || recs[i].thread != slot))
                continue;
            spyreshim_alloc_info *a = &s->allocs[s->n++];
            a->ptr = recs[i].ptr;
            a->size = (size_t)recs[i].size;
            a->seq = recs[i].seq;
            a->native_stack = recs[i].native_stack;
            a->python_stack = recs[i].python_stack;
            a->runtime = name;
            s->bytes += recs[i].size;
        }
        free(recs);
    }
    /* Memory passed through and watched (managed, host-pinned): its
     * family is its runtime's name in the reports. No thread is kept for
     * it: a thread's snapshot has the blocks the shim serves alone. */
    if (mine)
        return s;
    size_t k = 0;
    shim_pt_record *pt = shim_passthrough_live(since, &k);
    if (!pt && k) {
        spyreshim_snapshot_free(s);
        return NULL;
    }
    if (k) {
        spyreshim_alloc_info *na = realloc(s->allocs, (s->n + k) * sizeof *na);
        if (!na) {
            free(pt);
            spyreshim_snapshot_free(s);
            return NULL;
        }
        s->allocs = na;
        for (size_t i = 0; i < k; i++) {
            spyreshim_alloc_info *a = &s->allocs[s->n++];
            a->ptr = pt[i].ptr;
            a->size = (size_t)pt[i].size;
            a->seq = pt[i].seq;
            a->native_stack = pt[i].native_stack;
            a->python_stack = pt[i].python_stack;
            int dev = shim_passthrough_reported_device(&pt[i]);
            a->runtime = dev >= 0 ? shim_device_name(shim_device_at((size_t)dev))
                                  : shim_passthrough_family_name(pt[i].family);
            if (pt[i].va_size)
                a->runtime = mapped_label(a->runtime, pt[i].va, pt[i].va_size);
            s->bytes += pt[i].size;
        }
        free(pt);
    }
    return s;
}

SPYRESHIM_API size_t spyreshim_snapshot_count(const spyreshim_snapshot *s)
{
    return s ? s->n : 0;
}

SPYRESHIM_API uint64_t spyreshim_snapshot_bytes(const spyreshim_snapshot *s)
{
    return s ? s->bytes : 0;
}

SPYRESHIM_API const spyreshim_alloc_info *spyreshim_snapshot_get(const spyreshim_snapshot *s, size_t i)
{
    return s && i < s->n ? &s->allocs[i] : NULL;
}

SPYRESHIM_API int spyreshim_snapshot_print(const spyreshim_snapshot *s, int fd, size_t max_groups)
{
    if (!s) {
        errno = EINVAL;
        return -1;
    }
    shim_report *r = shim_report_build(s->allocs, s->n, shim_suppressions_active());
    if (!r) {
        errno = ENOMEM;
        return -1;
    }
    int rc = shim_report_print(r, fd, SHIM_REPORT_LIVE, "spyreshim: live device allocations",
                               max_groups);
    shim_report_free(r);
    return rc;
}

SPYRESHIM_API int spyreshim_snapshot_write_json(const spyreshim_snapshot *s, const char *path)
{
    if (!s || !path || !path[0]) {
        errno = EINVAL;
        return -1;
    }
    char expanded[4096];
    if (shim_path_expand(path, expanded, sizeof expanded) != 0)
        return -1;
    struct shim_path_whole w;
    FILE *f = shim_path_whole_open(&w, expanded);
    if (!f)
        return -1;
    shim_report *r = shim_report_build(s->allocs, s->n, shim_suppressions_active());
    if (!r) {
        shim_path_whole_close(&w, false);
        errno = ENOMEM;
        return -1;
    }
    int rc = shim_report_write_json(r, f, "snapshot");
    int err = errno;
    shim_report_free(r);
    if (shim_path_whole_close(&w, rc == 0) != 0) {
        if (rc == 0)
            err = errno;
        rc = -1;
    }
    errno = err;
    return rc;
}

SPYRESHIM_API void spyreshim_snapshot_free(spyreshim_snapshot *s)
{
    if (!s)
        return;
    free(s->allocs);
    free(s);
}
