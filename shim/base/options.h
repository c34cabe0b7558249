/* SPYRESHIM_* configuration, parsed once from one table (options.c).
 * A bad value gets one warning naming the variable and the default used. */
#ifndef SHIM_OPTIONS_H
#define SHIM_OPTIONS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* SPYRESHIM_LOG's values, in order: messages at a level below the one set
 * are not printed (log.c). */
enum shim_log_level { SHIM_LOG_DEBUG = 0, SHIM_LOG_INFO, SHIM_LOG_WARN, SHIM_LOG_OFF };

/* SPYRESHIM_GC's values: where a collection for a failing allocation runs
 * (python_gc/gc/policy.c). 1/true/yes/on mean auto, 0/false/no mean off. */
enum shim_gc_mode { SHIM_GC_MODE_AUTO = 0, SHIM_GC_MODE_INLINE, SHIM_GC_MODE_THREAD,
                    SHIM_GC_MODE_OFF };

/* SPYRESHIM_LEAK_CHECK's values (shim/leak/leak.c): held also makes what
 * Python held when it began to shut down decide the exit status. */
enum shim_leak_check { SHIM_LEAK_CHECK_OFF = 0, SHIM_LEAK_CHECK_ON, SHIM_LEAK_CHECK_HELD };

typedef struct shim_options {
    size_t limit;            /* SPYRESHIM_LIMIT: bytes the shim may reserve, 0 = no limit */
    size_t host_limit;       /* SPYRESHIM_HOST_LIMIT: host-pinned bytes, 0 = no limit */
    const char *stats_path;  /* SPYRESHIM_STATS */
    int log_level;           /* SPYRESHIM_LOG: enum shim_log_level */
    bool gc;                 /* SPYRESHIM_GC is not off */
    unsigned gc_mode;        /* SPYRESHIM_GC: enum shim_gc_mode */
    unsigned gc_timeout_ms;  /* SPYRESHIM_GC_TIMEOUT_MS */
    unsigned pressure_rounds;/* SPYRESHIM_PRESSURE_ROUNDS */
    size_t region_size;      /* SPYRESHIM_REGION_SIZE: 0 = adaptive */
    unsigned arenas;         /* SPYRESHIM_ARENAS: arenas per device, 0 = one per CPU */
    unsigned leak_check;     /* SPYRESHIM_LEAK_CHECK: enum shim_leak_check */
    unsigned stack_depth;    /* SPYRESHIM_STACK_DEPTH */
    bool python_stacks;      /* SPYRESHIM_PYTHON_STACKS */
    const char *report_path; /* SPYRESHIM_REPORT (%p = pid) */
    int exitcode;            /* SPYRESHIM_EXITCODE */
    const char *suppressions;/* SPYRESHIM_SUPPRESSIONS */
    unsigned oom_report_top; /* SPYRESHIM_OOM_REPORT: groups printed on a final OOM, 0 = off */
    bool control;            /* SPYRESHIM_CONTROL: the control socket (shim/leak/control.c) */
    const char *trace_path;  /* SPYRESHIM_TRACE (%p = pid) */
    unsigned trace_flush_ms; /* SPYRESHIM_TRACE_FLUSH_MS */
    bool trace_note;         /* SPYRESHIM_TRACE_NOTE: name the file written, at exit */
    bool secure;             /* AT_SECURE: paths from the environment are ignored */
    size_t cuda_ipc_min;     /* SPYRESHIM_CUDA_IPC_MIN: 0 = none */
    const char *cuda_ipc_callers; /* SPYRESHIM_CUDA_IPC_CALLERS: comma-separated object names */
} shim_options;

/* Parses the environment on first call; thread-safe; never fails.
 * Inline once parsed (a load and a test): a watched OpenCL create reads
 * the limit each time (docs/opencl.md, "Cost"). */
extern shim_options shim_opts_parsed;
extern _Atomic bool shim_opts_ready;
const shim_options *shim_opts_first(void);
static inline const shim_options *shim_opts(void)
{
    if (__builtin_expect(atomic_load_explicit(&shim_opts_ready, memory_order_acquire), 1))
        return &shim_opts_parsed;
    return shim_opts_first();
}
/* The options once parsed, else NULL: for a path that makes no call (it
 * then goes the general way, which parses them). */
static inline const shim_options *shim_opts_if_parsed(void)
{
    return atomic_load_explicit(&shim_opts_ready, memory_order_acquire) ? &shim_opts_parsed
                                                                        : NULL;
}
/* Re-reads the environment (tests). */
void shim_options_reload(void);
/* Writes the effective configuration, one "NAME=value" line each. */
void shim_options_dump(int fd);
/* Parses "64M", "1G", "4096" (binary suffixes K M G T). 0 on success; -1
 * with errno ERANGE when the size is 2^63 or more, EINVAL when malformed. */
int shim_parse_size(const char *s, size_t *out);

#endif
