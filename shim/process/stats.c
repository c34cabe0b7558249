/* Statistics: the public spyreshim_get_stats, the SPYRESHIM_STATS JSON
 * file and the SPYRESHIM_LOG=info summary line. Reads each device's
 * counters under that device's lock, one device at a time. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "collections.h"
#include "device.h"
#include "log.h"
#include "options.h"
#include "passthrough.h"
#include "path.h"
#include "pygc.h"
#include "stats.h"
#include "units.h"

SPYRESHIM_API int spyreshim_get_stats(spyreshim_stats *out)
{
    if (!out || out->size < sizeof(size_t))
        return -1;
    spyreshim_stats s;
    memset(&s, 0, sizeof s);
    size_t n = shim_device_count();
    uint64_t peak = shim_device_peak_all();
    for (size_t i = 0; i < n; i++) {
        /* The peak of the sum: no lower than any one device's peak or than
         * what is live now, never the sum of the devices' peaks. */
        uint64_t before = s.peak_used_bytes;
        shim_device_add_stats(shim_device_at(i), &s);
        if (s.peak_used_bytes - before > peak)
            peak = s.peak_used_bytes - before;
        s.peak_used_bytes = before;
    }
    s.peak_used_bytes = peak > s.used_bytes ? peak : s.used_bytes;
    shim_pygc_add_stats(&s);
    shim_pt_counters c;
    shim_passthrough_totals(SHIM_PT_MANAGED, &c);
    s.managed_bytes = c.bytes;
    s.managed_allocs = c.allocs;
    s.managed_frees = c.frees;
    shim_passthrough_totals(SHIM_PT_HOST_PINNED, &c);
    s.host_pinned_bytes = c.bytes;
    s.host_pinned_allocs = c.allocs;
    s.host_pinned_frees = c.frees;
    shim_passthrough_totals(SHIM_PT_VMM, &c);
    s.vmm_bytes = c.bytes;
    s.vmm_allocs = c.allocs;
    s.vmm_frees = c.frees;
    shim_passthrough_totals(SHIM_PT_ASYNC, &c);
    s.async_bytes = c.bytes;
    s.async_allocs = c.allocs;
    s.async_frees = c.frees;
    size_t len = out->size < sizeof s ? out->size : sizeof s;
    s.size = len;
    memcpy(out, &s, len);
    return 0;
}

/* One entry of the "passthrough" list: a family on a device (-1: host
 * memory, or managed memory allocated with no current context). */
struct family_out {
    FILE *f;
    bool first_done;
};

static void write_family(void *arg, enum shim_pt_family fam, int ordinal,
                         const shim_pt_counters *c)
{
    struct family_out *o = arg;
    fprintf(o->f, "%s\n    {\"family\": \"%s\", \"device\": %d, \"bytes\": %" PRIu64
               ", \"peak_bytes\": %" PRIu64 ", \"allocs\": %" PRIu64 ", \"frees\": %" PRIu64 "}",
            o->first_done ? "," : "", shim_passthrough_family_name(fam), ordinal, c->bytes,
            c->peak_bytes, c->allocs, c->frees);
    o->first_done = true;
}

static void write_json(FILE *f, const spyreshim_stats *s)
{
    const char *sep = "{\n  ";
#define FIELD(name, doc)                                                    \
    fprintf(f, "%s\"%s\": %" PRIu64, sep, #name, s->name);                  \
    sep = ",\n  ";
    SPYRESHIM_STATS_FIELDS(FIELD)
#undef FIELD
    shim_pygc_write_json(f);
    fprintf(f, ",\n  \"pid\": %d,\n  \"runtimes\": [", (int)getpid());
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        spyreshim_stats one;
        memset(&one, 0, sizeof one);
        shim_device *d = shim_device_at(i);
        shim_device_add_stats(d, &one);
        fprintf(f, "%s\n    {\"name\": \"%s\", \"reserved_bytes\": %" PRIu64
                   ", \"used_bytes\": %" PRIu64 ", \"peak_reserved_bytes\": %" PRIu64
                   ", \"peak_used_bytes\": %" PRIu64 ", \"allocs\": %" PRIu64
                   ", \"frees\": %" PRIu64 ", \"pressure_events\": %" PRIu64
                   ", \"arenas\": %" PRIu64 "}",
                i ? "," : "", shim_device_name(d), one.reserved_bytes, one.used_bytes,
                one.peak_reserved_bytes, one.peak_used_bytes, one.allocs, one.frees,
                one.pressure_events, one.arenas);
    }
    fprintf(f, "%s],\n  \"passthrough\": [", n ? "\n  " : "");
    struct family_out o = {f, false};
    shim_passthrough_each(write_family, &o);
    fprintf(f, "%s]\n}\n", o.first_done ? "\n  " : "");
}

SPYRESHIM_API void spyreshim_reset_peak(void)
{
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++)
        shim_device_reset_peak(shim_device_at(i));
    shim_device_peak_all_reset();
}

/* A run that needed collections says so at the default log level: the
 * program's reference cycles held device memory, and it went on because
 * the shim collected them, which it would not without the shim. */
static void rescue_line(const spyreshim_stats *s)
{
    if (!s->gc_collections)
        return;
    const shim_options *o = shim_opts();
    char where[1100], site[1024];
    if (o->trace_path && o->trace_path[0])
        snprintf(where, sizeof where, "where the cycles were made: spyreshim report --view gc %s",
                 o->trace_path);
    else if (shim_collections_top_site(site, sizeof site))
        snprintf(where, sizeof where, "the cycles' top site: %s", site);
    else
        snprintf(where, sizeof where, "where the cycles were made: run with --trace, "
                                      "then spyreshim report --view gc");
    char sz[SHIM_SIZE_TEXT];
    shim_warn("%" PRIu64 " collection(s) of Python's reference cycles freed device memory for "
              "this run (%.1f ms, %s); %s",
              s->gc_collections, (double)s->gc_time_ns / 1e6,
              shim_size_text(sz, s->gc_recovered_bytes), where);
}

void shim_stats_at_exit(void)
{
    const shim_options *o = shim_opts();
    if (shim_device_count() == 0 && !shim_passthrough_used())
        return; /* never touched a runtime: stay silent, write nothing */

    spyreshim_stats s = {.size = sizeof s};
    spyreshim_get_stats(&s);

    if (o->stats_path) {
        char path[4096];
        if (shim_path_expand(o->stats_path, path, sizeof path) != 0) {
            shim_warn("SPYRESHIM_STATS: path too long; statistics not written");
        } else {
            /* The report files' policy: no symlink, no FIFO or device, never
             * another user's file or a hard link. */
            struct shim_path_whole w;
            FILE *f = shim_path_whole_open(&w, path);
            if (!f) {
                shim_warn("SPYRESHIM_STATS: cannot write %s: %s", path, shim_path_why(errno));
            } else {
                write_json(f, &s);
                if (shim_path_whole_close(&w, true) != 0)
                    shim_warn("SPYRESHIM_STATS: writing %s failed: %s", path, strerror(errno));
                else if (w.replaced_newer)
                    shim_warn("SPYRESHIM_STATS: %s was written by another process since this "
                              "one started; replaced by this process's (pid %ld): put %%p in "
                              "the path for a file per process", path, (long)getpid());
            }
        }
    }

    rescue_line(&s);
    /* "recovered" once: what pressure events got back from the callbacks,
     * the collections' share of it in brackets (the collector is one of
     * the callbacks: its bytes are counted in both statistics). */
    char used[SHIM_SIZE_TEXT], reserved[SHIM_SIZE_TEXT], cb[SHIM_SIZE_TEXT], gc[SHIM_SIZE_TEXT];
    shim_info("%" PRIu64 " allocs, %" PRIu64 " frees, peak %s in use / %s reserved, %" PRIu64
              " pressure events recovered %s in %" PRIu64 " callback runs (%" PRIu64
              " collections in %.1f ms, %" PRIu64 " timeouts: %s of it), %" PRIu64
              " failed allocs",
              s.allocs, s.frees, shim_size_text(used, s.peak_used_bytes),
              shim_size_text(reserved, s.peak_reserved_bytes), s.pressure_events,
              shim_size_text(cb, s.callback_recovered_bytes), s.callback_runs, s.gc_collections,
              (double)s.gc_time_ns / 1e6, s.gc_timeouts, shim_size_text(gc, s.gc_recovered_bytes),
              s.failed_allocs);
}
