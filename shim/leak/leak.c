/* Leak checking: the hooks the device layer calls (leak.h).
 *
 * Owns the on/off switch and the capture depth (written once by
 * shim_leak_init from the constructor, read-only afterwards) and the
 * at-exit and out-of-memory reports (the last out-of-memory's snapshot is
 * kept and judged at exit). Capture runs on the allocating thread
 * before the allocator lock is taken and must stay cheap: a native unwind
 * and an interning lookup (stack.c), plus a Python frame walk when asked
 * (pystack). Reports run with no shim lock held; they copy the live records
 * (each arena lock taken briefly by shim_device_live) and work on the copy.
 * Never touches a Python object: Python frames were resolved by the pystack
 * module while the interpreter was alive.
 */
#include "leak.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "collections.h"
#include "device.h"
#include "exitstatus.h"
#include "find.h"
#include "log.h"
#include "mutex.h"
#include "options.h"
#include "passthrough.h"
#include "pressure.h"
#include "origin.h"
#include "pystack.h"
#include "report.h"
#include "path.h"
#include "shutdown.h"
#include "spyreshim.h"
#include "stack.h"
#include "stackdepth.h"
#include "suppress.h"
#include "units.h"

/* SPYRESHIM_STACK_DEPTH unset (stackdepth.h says why these). */
#define DEFAULT_DEPTH SHIM_STACK_DEPTH_DEFAULT
#define DEFAULT_DEPTH_PYTHON SHIM_STACK_DEPTH_DEFAULT_PYTHON

static atomic_bool g_enabled;
static unsigned g_depth;             /* SPYRESHIM_STACK_DEPTH; 0: the defaults above */
/* The default in force: DEFAULT_DEPTH until the first Python stack is
 * recorded, DEFAULT_DEPTH_PYTHON from then on (never back). */
static _Atomic unsigned g_depth_auto = DEFAULT_DEPTH;
static bool g_python;
static atomic_flag g_exit_done = ATOMIC_FLAG_INIT;

void shim_leak_init(void)
{
    const shim_options *o = shim_opts();
    /* The OOM report lists what holds memory even without stacks. */
    shim_device_set_leak_hooks(NULL, shim_leak_on_oom);
    /* A trace records the same stacks, without the report or the verdict. */
    bool trace = o->trace_path && o->trace_path[0];
    if ((!o->leak_check && !trace) || atomic_load(&g_enabled))
        return;
    unsigned depth = o->stack_depth;
    if (depth > SHIM_STACK_MAX_DEPTH) {
        shim_warn("SPYRESHIM_STACK_DEPTH=%u is above %u: using %u", depth,
                  SHIM_STACK_MAX_DEPTH, SHIM_STACK_MAX_DEPTH);
        depth = SHIM_STACK_MAX_DEPTH;
    }
    g_depth = depth;
    shim_stack_init();
    g_python = o->python_stacks;
    if (o->leak_check) {
        atomic_store_explicit(&g_enabled, true, memory_order_release);
        shim_collections_init();
    }
    shim_device_set_leak_hooks(shim_leak_capture, shim_leak_on_oom);
    shim_passthrough_set_capture(shim_leak_capture);
}

bool shim_leak_enabled(void)
{
    return atomic_load_explicit(&g_enabled, memory_order_relaxed);
}

/* Native stacks seen when the interpreter finder was last told of new
 * code: a stack id above it is new (ids grow by one per new stack). */
static _Atomic uint32_t g_stacks_hinted;

void shim_leak_capture(uint32_t *native_stack, uint32_t *python_stack)
{
    *native_stack = *python_stack = 0;
    /* An allocation made by a pressure callback before it released the
     * allocator lock: unwinding walks the loaded objects (the loader's
     * lock), which no lock of ours may be held across. */
    if (shim_locks_held())
        return;
    /* The program runs: from now on its exit status can be known at exit
     * (exitstatus.c says why not earlier). One load after the first. */
    shim_exitstatus_watch();
    unsigned depth = g_depth ? g_depth : atomic_load_explicit(&g_depth_auto, memory_order_relaxed);
    uint32_t id = shim_stack_capture(depth);
    *native_stack = id;
    if (!g_python)
        return;
    /* A new native stack (or none: no unwinder) is the only sign on this
     * path that code never seen before runs, e.g. an interpreter loaded
     * since: only then may the finder look at the loader again. */
    uint32_t seen = atomic_load_explicit(&g_stacks_hinted, memory_order_relaxed);
    if (id == 0 || id > seen) {
        if (id > seen)
            atomic_compare_exchange_strong(&g_stacks_hinted, &seen, id);
        shim_python_find_hint();
    }
    uint32_t py = shim_pystack_capture(depth);
    /* A thread without Python frames running work a Python call handed
     * off (the autograd engine's device thread in backward()): the
     * caller's stack, flagged as the origin (origin.c). */
    *python_stack = py ? py : shim_origin_current();
    /* Python runs here: the exit check also needs what it holds when it
     * begins to shut down (shutdown.c). */
    if (py && atomic_load_explicit(&g_enabled, memory_order_relaxed))
        shim_shutdown_watch();
    /* The first Python stack recorded (by any thread) switches the default
     * to the Python one; this capture's stacks are taken again where the
     * short depth cut them. One compare on every other capture. */
    if (py && depth == DEFAULT_DEPTH && !g_depth) {
        atomic_store_explicit(&g_depth_auto, DEFAULT_DEPTH_PYTHON, memory_order_relaxed);
        const uintptr_t *frames;
        if (id && shim_stack_frames(id, &frames) >= depth)
            *native_stack = shim_stack_capture(DEFAULT_DEPTH_PYTHON);
        if (shim_pystack_flags(py) & SHIM_PYSTACK_TRUNCATED)
            *python_stack = shim_pystack_capture(DEFAULT_DEPTH_PYTHON);
    }
}

/* The expanded SPYRESHIM_REPORT path (plus `suffix`), or false when there is
 * none (in secure mode options.c leaves it unset). */
static bool report_path(const char *suffix, char *out, size_t n)
{
    const shim_options *o = shim_opts();
    if (!o->report_path || !o->report_path[0])
        return false;
    char tmpl[4096];
    if ((size_t)snprintf(tmpl, sizeof tmpl, "%s%s", o->report_path, suffix) >= sizeof tmpl ||
        shim_path_expand(tmpl, out, n) != 0) {
        shim_warn("SPYRESHIM_REPORT: path too long, no report written");
        return false;
    }
    return true;
}

/* Writes the JSON report next to the text one; `members` (may be NULL)
 * adds top-level members of raw JSON (the out-of-memory's "oom" object). */
static void write_json(const shim_report *r, const char *suffix, const char *reason,
                       const char *members)
{
    char path[4096];
    if (!report_path(suffix, path, sizeof path))
        return;
    struct shim_path_whole w;
    FILE *f = shim_path_whole_open(&w, path);
    if (!f) {
        shim_warn("cannot write report %s: %s", path, shim_path_why(errno));
        return;
    }
    int rc = shim_report_write_json_extra(r, f, reason, members);
    if (shim_path_whole_close(&w, rc == 0) != 0)
        shim_warn("writing report %s failed: %s", path, strerror(errno));
    else if (w.replaced_newer)
        shim_warn("SPYRESHIM_REPORT: %s was written by another process since this one started; "
                  "replaced by this process's report (pid %ld): put %%p in the path for a "
                  "report per process", path, (long)getpid());
}

/* Successful allocations so far, every device and every family passed
 * through: what tells a program that recovered from its last failure.
 * Not the sequence counter: a trace numbers frees, collections and the
 * failure itself from it too, and a program that only freed after its
 * failure did not recover. */
static uint64_t allocations_so_far(void)
{
    spyreshim_stats st;
    memset(&st, 0, sizeof st);
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++)
        shim_device_add_stats(shim_device_at(i), &st);
    uint64_t total = st.allocs;
    for (int f = 0; f < SHIM_PT_FAMILIES; f++) {
        shim_pt_counters c;
        shim_passthrough_totals((enum shim_pt_family)f, &c);
        total += c.allocs;
    }
    return total;
}

/* The last out-of-memory, kept for the verdict at exit: a copy of the live
 * records (stack ids only, nothing resolved), what failed, and how many
 * allocations had succeeded at that moment. Published by an atomic
 * exchange, so no lock (none to be left held by a fork, none to order
 * with others). */
typedef struct oom_state {
    spyreshim_snapshot *snap;
    char runtime[32];
    size_t size;
    uint64_t allocations;
    shim_oom_facts facts;
    char verdict[289];   /* with "spyreshim: " in front, at most 300 characters */
} oom_state;

static _Atomic(oom_state *) g_oom;
static atomic_bool g_oom_line_done;
/* The groups the out-of-memory report printed at exit, so that the leak
 * report after it gives each of those stacks once. Exit's thread only. */
static shim_report_key *g_oom_printed;
static size_t g_noom_printed;

static void oom_state_free(oom_state *st)
{
    if (st) {
        spyreshim_snapshot_free(st->snap);
        free(st);
    }
}

void shim_leak_on_oom(const char *runtime, size_t size, const shim_oom_facts *facts)
{
    const shim_options *o = shim_opts();
    if (o->oom_report_top == 0)
        return;
    /* On the failing thread, which may hold the GIL or a framework's lock,
     * and whose program may well recover (a caching allocator frees its
     * cache and retries): no loader call, no DWARF, no Python, no report.
     * A copy of the live records and, once per process, one line. */
    oom_state *st = calloc(1, sizeof *st);
    if (!st)
        return;
    st->allocations = allocations_so_far();
    st->snap = spyreshim_snapshot_take(0);
    snprintf(st->runtime, sizeof st->runtime, "%s", runtime);
    st->size = size;
    st->facts = *facts;
    shim_oom_verdict_line(facts, runtime, st->verdict, sizeof st->verdict);
    uint64_t bytes = spyreshim_snapshot_bytes(st->snap);
    size_t blocks = spyreshim_snapshot_count(st->snap);
    oom_state_free(atomic_exchange(&g_oom, st));
    if (!atomic_exchange(&g_oom_line_done, true)) {
        const char *name;
        shim_oom_verdict(facts, &name);
        char asked[SHIM_SIZE_TEXT], live[SHIM_SIZE_TEXT];
        shim_warn("out of %s memory for %s (live: %s in %zu blocks); "
                  "full report at exit if it does not recover (verdict: %s)",
                  runtime, shim_size_text(asked, size), shim_size_text(live, bytes), blocks, name);
    }
}

void shim_leak_oom_at_exit(void)
{
    oom_state *st = atomic_exchange(&g_oom, NULL);
    if (!st || !st->snap) {
        oom_state_free(st);
        return;
    }
    /* As a user would judge it: the program recovered when something was
     * allocated after its last failure; if not, that failure is what it
     * ended on, and the report shows what held the memory then. */
    if (allocations_so_far() != st->allocations) {
        oom_state_free(st);
        return;
    }
    const shim_options *o = shim_opts();
    /* A collection in flight at the failure has ended since: what it freed
     * after the failure was live but unreachable; the verdict says so. */
    if (st->facts.collecting &&
        shim_pressure_failure_outcome(&st->facts.unreachable)) {
        st->facts.unreachable_known = true;
        shim_oom_verdict_line(&st->facts, st->runtime, st->verdict, sizeof st->verdict);
    }
    spyreshim_snapshot *s = st->snap;
    size_t n = spyreshim_snapshot_count(s);
    /* What holds memory, all of it: suppressions are for leak verdicts. */
    shim_report *r = shim_report_build(n ? spyreshim_snapshot_get(s, 0) : NULL, n, NULL);
    if (r) {
        char headline[320 + sizeof st->verdict + 16], asked[SHIM_SIZE_TEXT];
        snprintf(headline, sizeof headline,
                 "spyreshim: out of %s memory: a request of %s failed and nothing was "
                 "allocated after it; top %u holders of device memory at that moment%s:",
                 st->runtime, shim_size_text(asked, st->size), o->oom_report_top,
                 shim_leak_enabled() ? "" : " (SPYRESHIM_LEAK_CHECK=1 records their stacks)");
        size_t hl = strlen(headline);
        snprintf(headline + hl, sizeof headline - hl, "\nspyreshim: %s", st->verdict);
        shim_report_print(r, STDERR_FILENO, SHIM_REPORT_LIVE, headline, o->oom_report_top);
        g_oom_printed = malloc(o->oom_report_top * sizeof *g_oom_printed);
        if (g_oom_printed)
            g_noom_printed = shim_report_printed_keys(r, o->oom_report_top, g_oom_printed,
                                                      o->oom_report_top);
        char oom_json[720];
        const shim_oom_facts *f = &st->facts;
        char unreachable[24] = "null";
        if (f->unreachable_known)
            snprintf(unreachable, sizeof unreachable, "%" PRIu64, f->unreachable);
        const char *name;
        shim_oom_verdict(f, &name);
        snprintf(oom_json, sizeof oom_json,
                 "\"oom\": {\"verdict\": \"%s\", \"request\": %" PRIu64 ", \"largest_hole\": %" PRIu64
                 ", \"free_in_regions\": %" PRIu64 ", \"free_outside_regions\": %" PRIu64
                 ", \"reserved\": %" PRIu64 ", \"used\": %" PRIu64 ", \"limit\": %" PRIu64
                 ", \"device_free\": %" PRIu64 ", \"device_total\": %" PRIu64
                 ", \"collection_running_ns\": %" PRIu64 ", \"unreachable\": %s}",
                 name, f->request, f->largest_hole, f->free_in_regions,
                 f->device_known ? f->device_free : 0, f->reserved, f->used, f->limit,
                 f->device_free, f->device_total, f->collecting ? f->collecting_ns : 0,
                 unreachable);
        write_json(r, ".oom", "oom", oom_json);
        shim_report_free(r);
    }
    oom_state_free(st);
}

/* Blocks the runtime freed with their context (a CUDA context destroyed or
 * reset, docs/cuda.md): neither leaks nor live, so they are in no report;
 * one line says how many, so that a program that lost its context is not
 * left wondering where its blocks went. */
static void print_teardown_blocks(void)
{
    spyreshim_stats st;
    memset(&st, 0, sizeof st);
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++)
        shim_device_add_stats(shim_device_at(i), &st);
    char sz[SHIM_SIZE_TEXT];
    if (st.context_teardown_blocks)
        dprintf(STDERR_FILENO,
                "spyreshim: %" PRIu64 " block(s), %s, were freed by their "
                "context's teardown (not leaks)\n",
                st.context_teardown_blocks, shim_size_text(sz, st.context_teardown_bytes));
}

/* Groups of the held-until-exit section printed when they do not decide
 * the exit status (the JSON report has them all): a clean program's model
 * is held until exit, and its stacks are not news. */
#define HELD_SHOWN 3

static int cmp_seq(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The records of `s` that are not in `held` (by allocation sequence, which
 * no reuse of an address repeats), in `out` (n entries); returns how many. */
static size_t not_held(const spyreshim_snapshot *s, const spyreshim_snapshot *held,
                       spyreshim_alloc_info *out)
{
    size_t n = spyreshim_snapshot_count(s), nh = held ? spyreshim_snapshot_count(held) : 0;
    uint64_t *seqs = nh ? malloc(nh * sizeof *seqs) : NULL;
    if (nh && !seqs)
        nh = 0;   /* out of host memory: everything live counts, as before */
    for (size_t i = 0; i < nh; i++)
        seqs[i] = spyreshim_snapshot_get(held, i)->seq;
    if (nh)
        qsort(seqs, nh, sizeof *seqs, cmp_seq);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const spyreshim_alloc_info *a = spyreshim_snapshot_get(s, i);
        if (!nh || !bsearch(&a->seq, seqs, nh, sizeof *seqs, cmp_seq))
            out[k++] = *a;
    }
    free(seqs);
    return k;
}

void shim_leak_at_exit(void)
{
    if (!shim_leak_enabled() || atomic_flag_test_and_set(&g_exit_done))
        return;
    /* A process that never touched a runtime has nothing to say, and with
     * a fixed SPYRESHIM_REPORT path its empty report would replace the one
     * of the child that leaked (a shell running the program). The stats
     * file follows the same rule (shim/process/stats.c). */
    if (shim_device_count() == 0 && !shim_passthrough_used())
        return;
    const shim_options *o = shim_opts();
    spyreshim_snapshot *held = shim_shutdown_take();
    spyreshim_snapshot *s = spyreshim_snapshot_take(0);
    size_t n = s ? spyreshim_snapshot_count(s) : 0;
    spyreshim_alloc_info *leaks = malloc((n ? n : 1) * sizeof *leaks);
    if (!s || !leaks) {
        shim_warn("leak check: out of host memory, no report");
        spyreshim_snapshot_free(s);
        spyreshim_snapshot_free(held);
        free(leaks);
        return;
    }
    /* Leaked: live now, after finalization, and not held by Python when it
     * began to shut down (what it held then is reported apart: finalization
     * frees it or not depending on the framework, not on the program). */
    size_t nl = not_held(s, held, leaks);
    size_t nh = held ? spyreshim_snapshot_count(held) : 0;
    /* Under "held" both decide the status: the JSON's verdict groups are
     * both, as the text's two sections are. */
    bool strict = o->leak_check == SHIM_LEAK_CHECK_HELD;
    spyreshim_alloc_info *all = strict && nh ? realloc(leaks, (nl + nh) * sizeof *leaks) : leaks;
    if (all) {
        leaks = all;
        if (strict)
            for (size_t i = 0; i < nh; i++)
                leaks[nl++] = *spyreshim_snapshot_get(held, i);
    }
    const shim_suppressions *sup = shim_suppressions_active();
    shim_report *r = shim_report_build(nl ? leaks : NULL, nl, sup);
    free(leaks);
    spyreshim_snapshot_free(s);
    shim_report *hr = held ? shim_report_build_like(nh ? spyreshim_snapshot_get(held, 0) : NULL,
                                                    nh, sup, r)
                           : NULL;
    spyreshim_snapshot_free(held);
    if (!r || (held && !hr)) {
        shim_warn("leak check: out of host memory, no report");
        shim_report_free(hr);
        shim_report_free(r);
        return;
    }
    /* A program that ended on an out-of-memory leaks what held the device
     * then: those stacks were just printed (the JSON keeps them all). */
    shim_report_mark_printed(r, g_oom_printed, g_noom_printed);
    if (hr)
        shim_report_mark_printed(hr, g_oom_printed, g_noom_printed);
    free(g_oom_printed);
    g_oom_printed = NULL;
    g_noom_printed = 0;
    uint64_t leaked_bytes, leaked, held_bytes = 0, held_count = 0;
    shim_report_totals(r, &leaked_bytes, &leaked, NULL, NULL);
    if (hr)
        shim_report_totals(hr, &held_bytes, &held_count, NULL, NULL);
    print_teardown_blocks();
    if (strict) {
        if (leaked)
            shim_report_print(r, STDERR_FILENO, SHIM_REPORT_LEAKS,
                              "ERROR: spyreshim: detected device memory leaks, or held by "
                              "Python until exit (live when the interpreter began to shut "
                              "down, after a collection; --leak-check=held)", 0);
    } else {
        if (held_count)
            shim_report_print(hr, STDERR_FILENO, SHIM_REPORT_HELD,
                              "spyreshim: device memory held by Python until exit (live when "
                              "the interpreter began to shut down, after a collection; not "
                              "leaks: --leak-check=held counts them)", HELD_SHOWN);
        if (leaked)
            shim_report_print(r, STDERR_FILENO, SHIM_REPORT_LEAKS,
                              "ERROR: spyreshim: detected device memory leaks", 0);
    }
    char *coll = shim_collections_json();
    char *hj = hr ? shim_report_groups_json(hr) : NULL;
    char *members = NULL;
    if (asprintf(&members, "%s%s%s%s%s", hj ? "\"held_until_exit\": " : "", hj ? hj : "",
                 hj && coll ? ",\n  " : "", coll ? "\"collections\": " : "", coll ? coll : "") < 0)
        members = NULL;
    write_json(r, "", "exit", members && members[0] ? members : NULL);
    free(members);
    free(hj);
    free(coll);
    shim_report_free(hr); /* before r: it names its frames with r's symbolizer */
    shim_report_free(r);
    bool fail = leaked != 0;
    int own;
    if (fail && o->exitcode != 0 && shim_exitstatus_get(&own) && (own & 0xff) != 0) {
        /* The program failed on its own (an out-of-memory it gave up on,
         * an error): its status says more than the leak verdict, which the
         * report above already gave. */
        dprintf(STDERR_FILENO, "spyreshim: the program exits with status %d, kept (leaks "
                "would have made it SPYRESHIM_EXITCODE=%d)\n", own & 0xff, o->exitcode);
        return;
    }
    if (fail && o->exitcode != 0) {
        /* As LeakSanitizer: the verdict replaces the status of a program
         * that succeeded. Flush what the program buffered, since _exit
         * skips stdio. */
        fflush(NULL);
        _exit(o->exitcode);
    }
}
