/* SPYRESHIM_* configuration: one table row per variable (name, kind,
 * default, bounds, doc). The same table parses, validates (one warning per
 * bad value, naming the variable and the default used; one per name in the
 * environment that looks like ours and is no option, naming the closest
 * option), dumps the effective configuration for SPYRESHIM_LOG=debug, and
 * is what README's table is written from. No other file calls getenv for
 * SPYRESHIM_*.
 *
 * Parsing must not call shim_log(): shim_log() reads the options, and the
 * options are being built. Warnings go through warn_bad() instead, and this
 * file includes nothing of log.c's (log.c depends on it, never the other
 * way: docs/architecture.md). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <unistd.h>

#include "escape.h"
#include "options.h"
#include "stackdepth.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* K_FILE: a path to a file the shim opens later (at exit, at the first
 * flush), resolved at load against the working directory then: the
 * program's later chdir() must not move it (issue 47). K_PATH: kept as
 * given. */
enum kind { K_SIZE, K_BOOL, K_UINT, K_INT, K_PATH, K_FILE, K_LOGLEVEL, K_GCMODE, K_LEAKCHECK };

struct row {
    const char *name;
    enum kind kind;
    size_t offset;
    const char *def;      /* default, as the user would write it */
    long long min, max;   /* K_UINT/K_INT bounds; K_SIZE minimum (0 always allowed) */
    const char *doc;
};

#define OFF(f) offsetof(shim_options, f)
static const struct row rows[] = {
    {"SPYRESHIM_LOG", K_LOGLEVEL, OFF(log_level), "warn", 0, 0,
     "debug|info|warn|off; info prints a one-line summary at exit"},
    {"SPYRESHIM_LIMIT", K_SIZE, OFF(limit), "0", 0, 0,
     "cap on bytes reserved from the runtime, per device (K/M/G/T suffixes, binary); 0 = the device's capacity"},
    {"SPYRESHIM_HOST_LIMIT", K_SIZE, OFF(host_limit), "0", 0, 0,
     "cap on CUDA host-pinned memory (cuMemHostAlloc, cuMemAllocHost, cuMemHostRegister), all of it together (K/M/G/T suffixes, binary); 0 = no limit"},
    {"SPYRESHIM_STATS", K_FILE, OFF(stats_path), "", 0, 0,
     "write statistics as one JSON object to this path at exit (%p = pid, %r %l %R %h = rank, local rank, restart, host); only processes that touched a runtime write it"},
    {"SPYRESHIM_REGION_SIZE", K_SIZE, OFF(region_size), "0", 1 << 20, 0,
     "size of the regions reserved from the runtime; 0 = adaptive"},
    {"SPYRESHIM_ARENAS", K_UINT, OFF(arenas), "0", 0, 8,
     "arenas per device: a thread that finds its arena busy with another allocating thread moves to one of its own, up to this many; 0 = one per CPU (at most 8), 1 = one arena for all threads"},
    {"SPYRESHIM_PRESSURE_ROUNDS", K_UINT, OFF(pressure_rounds), "3", 1, 16,
     "pressure events a request runs (callbacks, then retry) before out-of-memory; waits for other threads' events count apart, up to 4x this"},
    {"SPYRESHIM_GC", K_GCMODE, OFF(gc_mode), "auto", 0, 0,
     "auto|inline|thread|off: where garbage in the embedded Python is collected under memory pressure; auto decides per failing call from the caller's framework (docs/frameworks.md); 1 = auto, 0 = off"},
    {"SPYRESHIM_GC_TIMEOUT_MS", K_UINT, OFF(gc_timeout_ms), "2000", 1, 3600000,
     "longest a thread waits for pressure work done on its behalf (a collection by the GC thread, or another thread's pressure event) without that work making progress (its collection using CPU); a collection that keeps using CPU is waited for up to 30 times this"},
    {"SPYRESHIM_LEAK_CHECK", K_LEAKCHECK, OFF(leak_check), "0", 0, 0,
     "1: record stacks of live allocations; report at exit what leaked (live after the interpreter finalized and not held by Python when it began to) and, apart, what Python still held when it began to shut down; held: that too makes the exit status"},
    {"SPYRESHIM_STACK_DEPTH", K_UINT, OFF(stack_depth), "0", 0, 256,
     "native frames recorded per allocation (and Python frames at most); 0 = " STR(SHIM_STACK_DEPTH_DEFAULT) ", or " STR(SHIM_STACK_DEPTH_DEFAULT_PYTHON) " once Python frames are recorded"},
    {"SPYRESHIM_PYTHON_STACKS", K_BOOL, OFF(python_stacks), "1", 0, 0,
     "with leak checking or a trace, also record the Python stack of the allocating thread"},
    {"SPYRESHIM_REPORT", K_FILE, OFF(report_path), "", 0, 0,
     "write the leak report as JSON to this path at exit (%p = pid, %r %l %R %h = rank, local rank, restart, host); only processes that touched a runtime write it"},
    {"SPYRESHIM_EXITCODE", K_INT, OFF(exitcode), "23", 0, 255,
     "exit status when leaks remain at exit (leak checking on)"},
    {"SPYRESHIM_SUPPRESSIONS", K_FILE, OFF(suppressions), "", 0, 0,
     "file of leak:<pattern> lines; matching leaks are not reported"},
    {"SPYRESHIM_OOM_REPORT", K_UINT, OFF(oom_report_top), "10", 0, 1000,
     "stack groups printed at exit when the last failed request was never followed by a successful one (one line at the failure itself); 0 = none"},
    {"SPYRESHIM_CONTROL", K_BOOL, OFF(control), "0", 0, 0,
     "open a control socket (abstract, this process's pid in its name) on which `spyreshim snapshot PID` asks for the live allocations; same user only, ignored in secure mode"},
    {"SPYRESHIM_TRACE", K_FILE, OFF(trace_path), "", 0, 0,
     "record every allocation, free, pressure event, collection and OOM with its stacks to this file (%p = pid, %r %l %R %h = rank, local rank, restart, host; docs/trace-format.md)"},
    {"SPYRESHIM_TRACE_FLUSH_MS", K_UINT, OFF(trace_flush_ms), "1000", 1, 1000,
     "longest time a recorded event waits in memory before it is written to the trace"},
    {"SPYRESHIM_TRACE_NOTE", K_BOOL, OFF(trace_note), "0", 0, 0,
     "1: at exit, one line on stderr naming the trace file this process wrote (%p expanded, a .N suffix where the path was taken) and its events; `spyreshim run --trace` sets it"},
    {"SPYRESHIM_CUDA_IPC_MIN", K_SIZE, OFF(cuda_ipc_min), "0", 0, 0,
     "CUDA: cuMemAlloc requests of at least this size get a region of their own, so that an IPC handle (cuIpcGetMemHandle) can name them (each such request then costs the driver an allocation unless a cached region has its exact size); 0, the default = none (only blocks alone in their region by chance can be exported); `spyreshim run --preset torch` sets 2M"},
    {"SPYRESHIM_CUDA_IPC_CALLERS", K_PATH, OFF(cuda_ipc_callers), "", 0, 0,
     "CUDA: comma-separated names (substrings of the file name) of shared objects whose cuMemAlloc_v2 requests all get a region of their own, so that they can be exported (e.g. libnccl)"},
};
#undef OFF

/* SPYRESHIM_* names that are no option of the library but are read by
 * spyreshim's own tools: no warning for them. */
static const char *const others[] = {
    "SPYRESHIM_LIB",        /* the library `spyreshim run` preloads (spyreshim/cli/main.py) */
    "SPYRESHIM_BUILD",      /* a checkout's build folder (spyreshim/cli/main.py, the tests) */
    "SPYRESHIM_PRESETS",    /* `run --preset` (spyreshim/presets/__init__.py) */
    "SPYRESHIM_NO_NUMPY",   /* the trace reader's pure-Python path (spyreshim/reading/trace.py) */
    "SPYRESHIM_CACHE",      /* where the scripts (torch2_venv.sh, ...) keep their venvs */
    /* The test suite's (tests/integration, scripts/test.sh). */
    "SPYRESHIM_PYTHONS", "SPYRESHIM_PYTHONS_CACHE", "SPYRESHIM_SCREENSHOT_DIR",
    "SPYRESHIM_OPENCL_SUITE", "SPYRESHIM_MODEL_RUNS", "SPYRESHIM_TSAN", "SPYRESHIM_TSAN_BUILD",
    "SPYRESHIM_TEST_JOBS",
};

shim_options shim_opts_parsed;
_Atomic bool shim_opts_ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void write_err(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            return;
        }
        s += w;
        n -= (size_t)w;
    }
}

static void warn_bad(const struct row *r, const char *value, const char *why)
{
    if (shim_opts_parsed.log_level >= SHIM_LOG_OFF)
        return;
    /* One line whatever the value holds: a newline in it is escaped. */
    char shown[65], esc[4 * 64 + 1];
    snprintf(shown, sizeof shown, "%s", value);
    shim_escape_line(shown, esc, sizeof esc);
    char buf[512 + sizeof esc];
    snprintf(buf, sizeof buf,
             "spyreshim: warning: %s=\"%s\" is invalid (%s); using the default %s\n",
             r->name, esc, why, r->def[0] ? r->def : "(unset)");
    write_err(buf);
}

int shim_parse_size(const char *s, size_t *out)
{
    errno = EINVAL;
    if (!s || !*s)
        return -1;
    while (*s == ' ')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1; /* ERANGE: too large */
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    /* "64M", "64MB" and "64MiB" all mean 64 * 2^20: device memory is
     * always counted in binary units. */
    if (shift && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
        end += 2;
    else if (end[0] == 'b' || end[0] == 'B')
        end++;
    if (*end) {
        errno = EINVAL;
        return -1;
    }
    /* No device has 2^63 bytes, and requests above SIZE_MAX/2 always fail:
     * such a size is a mistake, not a setting. */
    if ((shift && v > (ULLONG_MAX >> shift)) || (v << shift) > (SIZE_MAX >> 1)) {
        errno = ERANGE;
        return -1;
    }
    *out = (size_t)(v << shift);
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"};
    static const char *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) { *out = true; return 0; }
        if (!strcasecmp(s, no[i])) { *out = false; return 0; }
    }
    return -1;
}

static int parse_ll(const char *s, long long min, long long max, long long *out)
{
    /* The same shape as a size (shim_parse_size): digits, with a '-' only
     * where negative values mean something; strtoll alone would also take
     * a leading tab or newline, a '+' and "-0". Leading spaces are
     * skipped, as a size's are. */
    while (*s == ' ')
        s++;
    const char *d = s[0] == '-' && min < 0 ? s + 1 : s;
    if (*d < '0' || *d > '9' || (s[0] == '-' && strspn(d, "0") == strlen(d)))
        return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static const char *const gc_modes[] = {"auto", "inline", "thread", "off"};

static int parse_gc_mode(const char *s, unsigned *out)
{
    for (unsigned i = 0; i < 4; i++)
        if (!strcasecmp(s, gc_modes[i])) { *out = i; return 0; }
    bool b;
    if (parse_bool(s, &b) == 0) { *out = b ? SHIM_GC_MODE_AUTO : SHIM_GC_MODE_OFF; return 0; }
    return -1;
}

static int parse_leak_check(const char *s, unsigned *out)
{
    bool b;
    if (!strcasecmp(s, "held")) { *out = SHIM_LEAK_CHECK_HELD; return 0; }
    if (parse_bool(s, &b) == 0) { *out = b ? SHIM_LEAK_CHECK_ON : SHIM_LEAK_CHECK_OFF; return 0; }
    return -1;
}

static int parse_level(const char *s, int *out)
{
    static const char *names[] = {"debug", "info", "warn", "off"};
    for (int i = 0; i < 4; i++)
        if (!strcasecmp(s, names[i])) { *out = i; return 0; }
    if (!strcasecmp(s, "warning")) { *out = SHIM_LOG_WARN; return 0; }
    return -1;
}

/* A malloc'ed copy of `path` made absolute against the working directory
 * now, whose `%` are written `%%` (the path is a template: shim/base/
 * path.c expands `%p`); as given when it is absolute or the directory
 * cannot be named (then it follows the working directory). */
static char *absolute(const char *path)
{
    char cwd[4096];
    if (path[0] == '/' || !getcwd(cwd, sizeof cwd))
        return strdup(path);
    size_t pct = 0, n = strlen(cwd);
    for (size_t i = 0; i < n; i++)
        pct += cwd[i] == '%';
    char *out = malloc(n + pct + 1 + strlen(path) + 1);
    if (!out)
        return strdup(path);
    char *o = out;
    for (size_t i = 0; i < n; i++) {
        *o++ = cwd[i];
        if (cwd[i] == '%')
            *o++ = '%';
    }
    if (o == out || o[-1] != '/')
        *o++ = '/';
    strcpy(o, path);
    return out;
}

/* Returns 0 and stores, or -1 with *why set. The default strings in the
 * table always parse. */
static int apply(const struct row *r, const char *s, const char **why)
{
    char *field = (char *)&shim_opts_parsed + r->offset;
    switch (r->kind) {
    case K_SIZE: {
        size_t v;
        if (shim_parse_size(s, &v)) {
            *why = errno == ERANGE ? "too large: at most 2^63-1 bytes"
                                   : "expected bytes with an optional K/M/G/T suffix";
            return -1;
        }
        if (v != 0 && v < (size_t)r->min) { *why = "below the minimum of 1M"; return -1; }
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case K_BOOL: {
        bool v;
        if (parse_bool(s, &v)) { *why = "expected 0 or 1"; return -1; }
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case K_UINT: {
        long long v;
        if (parse_ll(s, r->min, r->max, &v)) { *why = "expected an integer in range"; return -1; }
        unsigned u = (unsigned)v;
        memcpy(field, &u, sizeof u);
        return 0;
    }
    case K_INT: {
        long long v;
        if (parse_ll(s, r->min, r->max, &v)) { *why = "expected an integer from 0 to 255"; return -1; }
        int i = (int)v;
        memcpy(field, &i, sizeof i);
        return 0;
    }
    case K_PATH: {
        const char *v = *s ? strdup(s) : NULL;
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case K_FILE: {
        const char *v = *s ? absolute(s) : NULL;
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case K_LOGLEVEL: {
        int v;
        if (parse_level(s, &v)) { *why = "expected debug, info, warn or off"; return -1; }
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case K_LEAKCHECK: {
        unsigned v;
        if (parse_leak_check(s, &v)) { *why = "expected 0, 1 or held"; return -1; }
        memcpy(field, &v, sizeof v);
        return 0;
    }
    case K_GCMODE: {
        unsigned v;
        if (parse_gc_mode(s, &v)) { *why = "expected auto, inline, thread or off"; return -1; }
        memcpy(field, &v, sizeof v);
        shim_opts_parsed.gc = v != SHIM_GC_MODE_OFF;
        return 0;
    }
    }
    return -1;
}

/* A name as compared: upper case, without '_' and '-' (SPYRESHIM_LEAKCHECK
 * and spyreshim-leak-check are SPYRESHIM_LEAK_CHECK misspelt). Returns its
 * length, or 0 when it does not fit. */
static size_t squeeze(const char *s, size_t len, char *out, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (c == '_' || c == '-')
            continue;
        if (k + 1 >= n)
            return 0;
        out[k++] = c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
    }
    out[k] = 0;
    return k;
}

/* Damerau-Levenshtein distance (optimal string alignment) of two short
 * strings: an insertion, deletion, substitution or swap of neighbours is
 * one step. Three rows on the stack (1.5 KiB: any thread may parse). */
static size_t distance(const char *a, size_t na, const char *b, size_t nb)
{
    size_t rows3[3][65];
    if (na > 64 || nb > 64)
        return (size_t)-1;
    size_t *two = rows3[0], *one = rows3[1], *cur = rows3[2];
    for (size_t j = 0; j <= nb; j++)
        one[j] = j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t best = one[j - 1] + (a[i - 1] != b[j - 1]);
            if (one[j] + 1 < best)
                best = one[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                two[j - 2] + 1 < best)
                best = two[j - 2] + 1;
            cur[j] = best;
        }
        size_t *t = two;
        two = one;
        one = cur;
        cur = t;
    }
    return one[nb];
}

/* The option a misspelt name most likely meant, or NULL: the nearest
 * within a quarter of the option's own part (at least one step:
 * SPYRESHIM_LIMT, and SPYRESHIM_LEAKCHECK or spyreshim_limit at none);
 * else the longest option it begins with (SPYRESHIM_TRACEFILE,
 * SPYRESHIM_LOGLEVEL). */
static const char *closest(const char *name, size_t len)
{
    char want[65], have[65];
    size_t nw = squeeze(name, len, want, sizeof want);
    if (!nw)
        return NULL;
    const char *near = NULL, *prefix = NULL;
    size_t near_d = (size_t)-1, prefix_len = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        size_t nh = squeeze(rows[i].name, strlen(rows[i].name), have, sizeof have);
        size_t d = distance(want, nw, have, nh);
        size_t within = (nh - strlen("SPYRESHIM")) / 4;
        if (d <= (within ? within : 1) && d < near_d) {
            near_d = d;
            near = rows[i].name;
        }
        if (nw > nh && !strncmp(want, have, nh) && nh > prefix_len) {
            prefix_len = nh;
            prefix = rows[i].name;
        }
    }
    return near ? near : prefix;
}

/* One warning per name in the environment that begins with "spyreshim"
 * (any case) and is neither an option nor one of `others`: a misspelt
 * option is otherwise silently not applied. */
static void warn_unknown(void)
{
    extern char **environ;
    if (shim_opts_parsed.log_level >= SHIM_LOG_OFF || !environ)
        return;
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        size_t len = eq ? (size_t)(eq - *e) : strlen(*e);
        if (len < 9 || strncasecmp(*e, "spyreshim", 9) != 0)
            continue;
        bool known = false;
        for (size_t i = 0; i < sizeof rows / sizeof rows[0] && !known; i++)
            known = strlen(rows[i].name) == len && !strncmp(rows[i].name, *e, len);
        for (size_t i = 0; i < sizeof others / sizeof others[0] && !known; i++)
            known = strlen(others[i]) == len && !strncmp(others[i], *e, len);
        if (known)
            continue;
        char name[65], esc[4 * 64 + 1];
        snprintf(name, sizeof name, "%.*s", (int)(len < 64 ? len : 64), *e);
        shim_escape_line(name, esc, sizeof esc);
        const char *guess = closest(*e, len);
        char buf[640];
        if (guess)
            snprintf(buf, sizeof buf, "spyreshim: warning: %s is not an option (did you mean %s?); "
                     "ignored\n", esc, guess);
        else
            snprintf(buf, sizeof buf, "spyreshim: warning: %s is not an option; ignored "
                     "(SPYRESHIM_LOG=debug lists the options)\n", esc);
        write_err(buf);
    }
}

static void parse(void)
{
    memset(&shim_opts_parsed, 0, sizeof shim_opts_parsed);
    shim_opts_parsed.secure = getauxval(AT_SECURE) != 0;
    const char *why;
    /* Defaults first, so that a warning about one variable already sees
     * the default log level. */
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        apply(&rows[i], rows[i].def, &why);
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const struct row *r = &rows[i];
        const char *v = getenv(r->name);
        if (!v)
            continue;
        if ((r->kind == K_PATH || r->kind == K_FILE) && shim_opts_parsed.secure)
            continue; /* setuid: the environment is not trusted with paths */
        if (apply(r, v, &why) != 0) {
            warn_bad(r, v, why);
            apply(r, r->def, &why);
        }
    }
    warn_unknown();
}

/* parse, once; what the inline shim_opts reads from then on (release:
 * the options are written before it is seen set). */
static void parse_first(void)
{
    parse();
    atomic_store_explicit(&shim_opts_ready, true, memory_order_release);
}

const shim_options *shim_opts_first(void)
{
    pthread_once(&once, parse_first);
    return &shim_opts_parsed;
}

void shim_options_reload(void)
{
    pthread_once(&once, parse_first);
    parse();
}

void shim_options_dump(int fd)
{
    const shim_options *o = shim_opts();
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const struct row *r = &rows[i];
        const char *field = (const char *)o + r->offset;
        char val[256];
        switch (r->kind) {
        case K_SIZE: { size_t v; memcpy(&v, field, sizeof v); snprintf(val, sizeof val, "%zu", v); break; }
        case K_BOOL: { bool v; memcpy(&v, field, sizeof v); snprintf(val, sizeof val, "%d", v); break; }
        case K_UINT: { unsigned v; memcpy(&v, field, sizeof v); snprintf(val, sizeof val, "%u", v); break; }
        case K_INT: { int v; memcpy(&v, field, sizeof v); snprintf(val, sizeof val, "%d", v); break; }
        case K_PATH:
        case K_FILE: { const char *v; memcpy(&v, field, sizeof v); snprintf(val, sizeof val, "%s", v ? v : ""); break; }
        case K_LOGLEVEL: {
            static const char *names[] = {"debug", "info", "warn", "off"};
            int v; memcpy(&v, field, sizeof v);
            snprintf(val, sizeof val, "%s", names[v & 3]);
            break;
        }
        case K_GCMODE: {
            unsigned v; memcpy(&v, field, sizeof v);
            snprintf(val, sizeof val, "%s", gc_modes[v & 3]);
            break;
        }
        case K_LEAKCHECK: {
            unsigned v; memcpy(&v, field, sizeof v);
            snprintf(val, sizeof val, "%s", v == SHIM_LEAK_CHECK_HELD ? "held" : v ? "1" : "0");
            break;
        }
        }
        dprintf(fd, "spyreshim: option %s=%s  # %s\n", r->name, val, r->doc);
    }
    if (o->secure)
        dprintf(fd, "spyreshim: secure mode (AT_SECURE): path variables ignored\n");
}
