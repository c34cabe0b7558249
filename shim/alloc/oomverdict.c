/* The out-of-memory verdict (oomverdict.h): which of four causes made a
 * request fail for good, from the facts alloc_path.c gathered on the failure
 * path. Pure arithmetic on a copy: no lock, no allocation, no I/O, so the
 * failing thread (which may hold the GIL or a framework's lock) can call it.
 *
 * Order of the tests, and why:
 * - limit: the shim's cap stopped it although the runtime had the room;
 *   nothing else is wrong.
 * - collection: a collection run for pressure was still in flight when
 *   the request gave up waiting for it, and (once it ended) what it freed
 *   would have served the request: the live bytes were not all reachable
 *   (issue 44: "fragmentation" was said while 7.3 of 8 MiB were live,
 *   mostly cycles the collection in flight freed right after).
 * - foreign: the runtime's free is below total - reserved (what the shim
 *   accounts for), and that missing memory would have served the request.
 * - fragmentation: the free bytes inside the regions plus the runtime's
 *   free would serve it, but no hole is large enough.
 * - exhausted: otherwise; the program's live blocks fill the device. */
#include <inttypes.h>
#include <stdio.h>

#include "oomverdict.h"

static const char *const names[] = {
    [SHIM_OOM_FRAGMENTATION] = "fragmentation",
    [SHIM_OOM_EXHAUSTED] = "exhausted",
    [SHIM_OOM_LIMIT] = "limit",
    [SHIM_OOM_FOREIGN] = "foreign",
    [SHIM_OOM_COLLECTION] = "collection",
};

/* Bytes other allocations or processes hold: what the runtime lacks
 * beyond the shim's own regions. */
static uint64_t foreign_bytes(const shim_oom_facts *f)
{
    if (!f->device_known || f->device_total < f->reserved)
        return 0;
    uint64_t expected_free = f->device_total - f->reserved;
    return expected_free > f->device_free ? expected_free - f->device_free : 0;
}

enum shim_oom_kind shim_oom_verdict(const shim_oom_facts *f, const char **name)
{
    enum shim_oom_kind k;
    uint64_t outside = f->device_known ? f->device_free : 0;
    uint64_t foreign = foreign_bytes(f);
    if (f->limit && f->reserved + f->request > f->limit && f->device_known &&
        f->device_free >= f->request)
        k = SHIM_OOM_LIMIT;
    else if (f->collecting &&
             (!f->unreachable_known ||
              f->unreachable + f->free_in_regions + outside >= f->request))
        k = SHIM_OOM_COLLECTION;
    else if (foreign && outside < f->request && outside + foreign >= f->request)
        k = SHIM_OOM_FOREIGN;
    else if (f->holes_known && f->largest_hole < f->request &&
             f->free_in_regions + outside >= f->request)
        k = SHIM_OOM_FRAGMENTATION;
    else
        k = SHIM_OOM_EXHAUSTED;
    if (name)
        *name = names[k];
    return k;
}

const char *shim_oom_verdict_line(const shim_oom_facts *f, const char *runtime, char *out,
                                  size_t cap)
{
    const char *name;
    enum shim_oom_kind k = shim_oom_verdict(f, &name);
    uint64_t outside = f->device_known ? f->device_free : 0;
    switch (k) {
    case SHIM_OOM_LIMIT:
        snprintf(out, cap,
                 "verdict: limit: SPYRESHIM_LIMIT=%" PRIu64 " reached (%" PRIu64
                 " reserved + %" PRIu64 " asked) while %s had %" PRIu64 " bytes free",
                 f->limit, f->reserved, f->request, runtime, f->device_free);
        break;
    case SHIM_OOM_FOREIGN:
        snprintf(out, cap,
                 "verdict: foreign: %s reports %" PRIu64 " bytes free, %" PRIu64
                 " fewer than the shim accounts for (%" PRIu64 " total, %" PRIu64
                 " reserved): other allocations or processes hold the device",
                 runtime, f->device_free, foreign_bytes(f), f->device_total, f->reserved);
        break;
    case SHIM_OOM_COLLECTION:
        if (f->unreachable_known)
            snprintf(out, cap,
                     "verdict: collection: %" PRIu64 " bytes live, of which %" PRIu64
                     " unreachable (freed by the collection still running after %.0f ms "
                     "when this request gave up) and %" PRIu64 " reachable, for a request of %"
                     PRIu64,
                     f->used, f->unreachable < f->used ? f->unreachable : f->used,
                     (double)f->collecting_ns / 1e6,
                     f->unreachable < f->used ? f->used - f->unreachable : 0, f->request);
        else
            snprintf(out, cap,
                     "verdict: collection: %" PRIu64 " bytes live of %" PRIu64
                     " reserved while a collection had run %.0f ms without ending (a finalizer "
                     "blocked?); what it would free is unknown, for a request of %" PRIu64,
                     f->used, f->reserved, (double)f->collecting_ns / 1e6, f->request);
        break;
    case SHIM_OOM_FRAGMENTATION:
        snprintf(out, cap,
                 "verdict: fragmentation: %" PRIu64 " bytes free (%" PRIu64
                 " inside regions, %" PRIu64 " outside) but the largest hole is %" PRIu64
                 " bytes, for a request of %" PRIu64,
                 f->free_in_regions + outside, f->free_in_regions, outside, f->largest_hole,
                 f->request);
        break;
    default:
        snprintf(out, cap,
                 "verdict: exhausted: %" PRIu64 " bytes in live blocks of %" PRIu64
                 " reserved, %" PRIu64 " free inside regions (largest hole %" PRIu64
                 "), %" PRIu64 " outside, for a request of %" PRIu64,
                 f->used, f->reserved, f->free_in_regions, f->largest_hole, outside, f->request);
        break;
    }
    return name;
}
