/* python_gc/pystack.c and pyframes.c against a fake CPython 3.12 laid out
 * in this test's memory: thread state, _PyCFrame, _PyInterpreterFrame and
 * code objects at 3.12's offsets, and the C API functions pystack looks up
 * (reference counts, names, lines, pending calls) as stand-ins. No Python
 * is needed, so the interning, the bounds, the identity check, references
 * and the finalization gate are tested in isolation; the real interpreters
 * are tested in tests/integration/test_pystack.py. Built with small tables
 * (MAX_STACKS) to reach their bound. Criterion runs each test in its own
 * process, so each starts with pystack's state fresh. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "find.h"
#include "gate.h"
#include "log.h"
#include "pystack.h"

/* ---- the fake interpreter (3.12 offsets) ---- */

#define NCODE 8
#define NFRAME 160

typedef struct { uintptr_t w[16]; } fake_type;
static fake_type bool_type, code_type, frame_type;
static uintptr_t true_obj[4];
static uintptr_t interp_main[4], interp_sub[4];

typedef struct fake_str {
    uintptr_t refcnt, type, length;
    intptr_t hash;               /* offset 24, as PyASCIIObject */
    const char *text;
} fake_str;

typedef struct __attribute__((aligned(16))) fake_code {
    uint8_t b[192 + 64];         /* bytecode from 192 (3.12 co_code_adaptive) */
} fake_code;

typedef struct __attribute__((aligned(16))) fake_frame {
    uint8_t b[80];
} fake_frame;

static fake_code codes[NCODE];
static fake_str names[NCODE], other_name, file_str;
static long refs[NCODE];
static fake_frame frames[NFRAME];
static uintptr_t cframe[2];
static uint8_t tstate[128] __attribute__((aligned(16)));

static bool attached = true, finalizing;
static enum shim_py_kind kind = SHIM_PY_CPYTHON;
static int (*pending_fn)(void *);
static int pending_calls;
static void (*finalize_fn)(void);
static unsigned long gate_cycles;
static int warnings;

#define AT(p, off, T) (*(T *)((uint8_t *)(p) + (off)))

static void *fake_gilstate(void) { return tstate; }
static void *fake_current(void) { return attached ? tstate : NULL; }
static int code_index(void *c)
{
    for (int i = 0; i < NCODE; i++)
        if (c == &codes[i])
            return i;
    return -1;
}
static void fake_incref(void *o) { int i = code_index(o); cr_assert(i >= 0); refs[i]++; }
static void fake_decref(void *o) { int i = code_index(o); cr_assert(i >= 0); refs[i]--; }
static int fake_addr2line(void *c, int off) { return AT(c, 68, int32_t) + off / 2; }
static const char *fake_utf8(void *s) { return ((fake_str *)s)->text; }
static int fake_initialized(void) { return 1; }
static int fake_finalizing(void) { return finalizing; }
static void fake_fetch(void **a, void **b, void **c) { *a = *b = *c = NULL; }
static void fake_restore(void *a, void *b, void *c) { (void)a; (void)b; (void)c; }
static void *fake_main(void) { return interp_main; }
static int fake_pending(int (*fn)(void *), void *arg)
{
    (void)arg;
    pending_fn = fn;
    pending_calls++;
    return 0;
}

static uintptr_t none_obj[2];
static void fake_unused(void) { cr_assert_fail("pystack called a C API function it does not use"); }

static shim_python the_python = { .kind = SHIM_PY_CPYTHON, .major = 3, .minor = 12, .micro = 1 };

const shim_python *shim_python_find(void)
{
    the_python.kind = kind;
    return &the_python;
}

/* The finder's forced rescan: the fake has nothing to rescan. */
const shim_python *shim_python_find_now(void)
{
    return shim_python_find();
}

void *shim_python_sym(const shim_python *py, const char *name)
{
    (void)py;
    static const struct { const char *name; void *p; } syms[] = {
        { "_Py_TrueStruct", true_obj }, { "PyBool_Type", &bool_type },
        { "PyCode_Type", &code_type }, { "PyFrame_Type", &frame_type },
        { "PyGILState_GetThisThreadState", (void *)fake_gilstate },
        { "_PyThreadState_UncheckedGet", (void *)fake_current },
        { "Py_IncRef", (void *)fake_incref }, { "Py_DecRef", (void *)fake_decref },
        { "PyCode_Addr2Line", (void *)fake_addr2line }, { "PyUnicode_AsUTF8", (void *)fake_utf8 },
        { "Py_IsInitialized", (void *)fake_initialized }, { "_Py_IsFinalizing", (void *)fake_finalizing },
        { "PyErr_Fetch", (void *)fake_fetch }, { "PyErr_Restore", (void *)fake_restore },
        { "PyInterpreterState_Main", (void *)fake_main }, { "Py_AddPendingCall", (void *)fake_pending },
        { "_Py_NoneStruct", none_obj },
    };
    /* The rest of python_gc's table (pyapi.c), which pystack never calls. */
    static const char *const unused[] = {
        "PyGILState_Ensure", "PyGILState_Release", "PyEval_SaveThread", "PyEval_RestoreThread",
        "PyImport_ImportModule", "PyObject_GetAttrString", "PyObject_CallObject",
        "PyObject_CallFunctionObjArgs", "PyErr_Clear", "PyTuple_GetItem",
        "PyUnicode_CompareWithASCIIString", "PyList_Append", "PyLong_AsLong",
        "PyCFunction_NewEx", "Py_AtExit",
    };
    for (size_t i = 0; i < sizeof unused / sizeof unused[0]; i++)
        if (strcmp(unused[i], name) == 0)
            return (void *)fake_unused;
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++)
        if (strcmp(syms[i].name, name) == 0)
            return syms[i].p;
    return NULL;
}

void shim_gate_at_finalize(void (*fn)(void)) { finalize_fn = fn; }
unsigned long shim_gate_cycles(void) { return gate_cycles; }
/* shim_pystack_resolve_detached's gate: closed here (it is the control
 * thread's, tested through the library in tests/integration/test_snapshot.py). */
enum shim_gate_verdict shim_gate_enter(const shim_pyapi *api) { (void)api; return SHIM_GATE_REFUSE; }
void shim_gate_leave(void) {}
int shim_gate_arm(const shim_pyapi *api) { (void)api; return -1; }

void shim_log(enum shim_log_level level, const char *fmt, ...)
{
    if (level < SHIM_LOG_WARN)
        return;
    warnings++;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}
int shim_log_enabled(enum shim_log_level level) { return level >= SHIM_LOG_WARN; }

static char name_text[NCODE][16];

static void fake_setup(void)
{
    true_obj[0] = 1;
    true_obj[1] = (uintptr_t)&bool_type;
    AT(&code_type, 32, uintptr_t) = 192;          /* tp_basicsize */
    file_str = (fake_str){ 1, 0, 0, 1234, "/t/model.py" };
    for (int i = 0; i < NCODE; i++) {
        snprintf(name_text[i], sizeof name_text[i], "f%d", i);
        names[i] = (fake_str){ 1, 0, 2, 1000 + i, name_text[i] };
        memset(&codes[i], 0, sizeof codes[i]);
        AT(&codes[i], 0, uintptr_t) = 1;
        AT(&codes[i], 8, uintptr_t) = (uintptr_t)&code_type;
        AT(&codes[i], 68, int32_t) = 10 * (i + 1);  /* co_firstlineno */
        AT(&codes[i], 112, uintptr_t) = (uintptr_t)&file_str;
        AT(&codes[i], 120, uintptr_t) = (uintptr_t)&names[i];
        AT(&codes[i], 128, uintptr_t) = (uintptr_t)&names[i];   /* co_qualname */
        AT(&codes[i], 176, int32_t) = 0;            /* _co_firsttraceable */
    }
    other_name = (fake_str){ 1, 0, 2, 999, "newcomer" };
    AT(tstate, 16, uintptr_t) = (uintptr_t)interp_main;
    AT(tstate, 56, uintptr_t) = (uintptr_t)cframe;
}

/* Frames 0..n-1, innermost first; frame i runs code i at byte offset 2*off[i]. */
static void chain(int n, const int *code_of, const int *off)
{
    for (int i = 0; i < n; i++) {
        memset(&frames[i], 0, sizeof frames[i]);
        AT(&frames[i], 0, uintptr_t) = (uintptr_t)&codes[code_of[i]];
        AT(&frames[i], 8, uintptr_t) = i + 1 < n ? (uintptr_t)&frames[i + 1] : 0;
        AT(&frames[i], 56, uintptr_t) = (uintptr_t)&codes[code_of[i]] + 192 + 2 * (uintptr_t)off[i];
        AT(&frames[i], 70, uint8_t) = 0;           /* owned by the thread */
    }
    cframe[0] = n ? (uintptr_t)&frames[0] : 0;
}

static const int CODE3[] = { 0, 1, 2 }, OFF3[] = { 3, 4, 5 };

TestSuite(pystack, .init = fake_setup);

Test(pystack, interns_a_stack_and_resolves_its_names_and_lines)
{
    chain(3, CODE3, OFF3);
    uint32_t id = shim_pystack_capture(32);
    cr_assert_neq(id, 0);
    cr_assert_eq(shim_pystack_capture(32), id, "the same stack is one id");
    shim_pyframe f[8];
    cr_assert_eq(shim_pystack_frames(id, f, 8), 3);
    for (int i = 0; i < 3; i++) {
        cr_assert_str_eq(f[i].function, name_text[i]);
        cr_assert_str_eq(f[i].file, "/t/model.py");
        cr_assert_eq(f[i].line, 10 * (i + 1) + OFF3[i], "frame %d line %d", i, f[i].line);
    }
    AT(&frames[0], 56, uintptr_t) += 2;             /* the innermost frame moved on */
    uint32_t id2 = shim_pystack_capture(32);
    cr_assert(id2 != 0 && id2 != id);
    cr_assert_eq(shim_pystack_frames(id2, f, 8), 3);
    cr_assert_eq(f[0].line, 10 + OFF3[0] + 1);
    cr_assert_eq(shim_pystack_frames(0, f, 8), 0);
    cr_assert_eq(shim_pystack_frames(12345, f, 8), 0, "an id never given is no stack");
}

Test(pystack, keeps_at_most_the_depth_asked)
{
    int code_of[NFRAME], off[NFRAME];
    for (int i = 0; i < NFRAME; i++)
        code_of[i] = i % NCODE, off[i] = i;
    chain(NFRAME, code_of, off);
    shim_pyframe f[NFRAME];
    uint32_t id = shim_pystack_capture(5);
    cr_assert_eq(shim_pystack_frames(id, f, NFRAME), 5);
    cr_assert_str_eq(f[0].function, "f0");
    cr_assert_eq(shim_pystack_frames(shim_pystack_capture(1000), f, NFRAME), NFRAME);
}

Test(pystack, skips_shim_incomplete_and_non_code_frames)
{
    static const int code_of[] = { 0, 1, 2, 3 }, off[] = { 1, 1, 1, 1 };
    chain(4, code_of, off);
    AT(&frames[1], 70, uint8_t) = 3;                /* FRAME_OWNED_BY_CSTACK: a shim */
    AT(&codes[2], 176, int32_t) = 4;                /* not yet past RESUME at unit 4 */
    shim_pyframe f[8];
    uint32_t id = shim_pystack_capture(32);
    cr_assert_eq(shim_pystack_frames(id, f, 8), 2);
    cr_assert_str_eq(f[0].function, "f0");
    cr_assert_str_eq(f[1].function, "f3");
    AT(&frames[3], 70, uint8_t) = 1;                /* a generator's frame is always complete */
    AT(&codes[3], 176, int32_t) = 4;
    AT(&codes[0], 8, uintptr_t) = (uintptr_t)&frame_type;    /* not a code object */
    id = shim_pystack_capture(32);
    cr_assert_eq(shim_pystack_frames(id, f, 8), 1);
    cr_assert_str_eq(f[0].function, "f3");
}

Test(pystack, a_bad_pointer_truncates_the_stack_instead_of_crashing)
{
    chain(3, CODE3, OFF3);
    shim_pyframe f[8];
    /* Plausible but unmapped: until a walk proved the layout, reads go
     * through the kernel. */
    AT(&frames[0], 0, uintptr_t) = (uintptr_t)0x7ff0dead1000;
    cr_assert_eq(shim_pystack_capture(32), 0, "the innermost code object is unreadable");
    AT(&frames[0], 0, uintptr_t) = 3;               /* not even plausible */
    cr_assert_eq(shim_pystack_capture(32), 0);
    AT(&frames[0], 0, uintptr_t) = (uintptr_t)&codes[0];
    AT(&frames[1], 8, uintptr_t) = (uintptr_t)0x7ff0dead0000;
    cr_assert_eq(shim_pystack_frames(shim_pystack_capture(32), f, 8), 2);
    /* That walk did not end where a chain ends: still checked reads. */
    AT(&frames[0], 0, uintptr_t) = (uintptr_t)0x7ff0dead1000;
    cr_assert_eq(shim_pystack_capture(32), 0);
}

Test(pystack, a_dead_code_object_whose_address_is_reused_is_not_named_after_the_newcomer)
{
    chain(3, CODE3, OFF3);
    attached = false;                               /* no reference taken */
    uint32_t id = shim_pystack_capture(32);
    cr_assert_neq(id, 0);
    cr_assert_eq(refs[0] + refs[1] + refs[2], 0);
    AT(&codes[0], 120, uintptr_t) = (uintptr_t)&other_name;   /* another function now */
    AT(&codes[0], 128, uintptr_t) = (uintptr_t)&other_name;
    uint32_t id2 = shim_pystack_capture(32);
    cr_assert(id2 != id, "the newcomer gets a stack of its own");
    attached = true;
    shim_pyframe f[8];
    cr_assert_eq(shim_pystack_frames(id, f, 8), 3);
    cr_assert_str_eq(f[0].function, "<unknown>");
    cr_assert_str_eq(f[0].file, "<unknown>");
    cr_assert_eq(f[0].line, 0);
    cr_assert_str_eq(f[1].function, "f1", "the frames that still live resolve");
    cr_assert_eq(shim_pystack_frames(id2, f, 8), 3);
    cr_assert_str_eq(f[0].function, "newcomer");
    /* A string reusing the old name's address, with other contents. */
    other_name.hash = names[0].hash;
    AT(&codes[0], 120, uintptr_t) = (uintptr_t)&names[0];
    names[0].hash = 4242;
    attached = false;
    uint32_t id3 = shim_pystack_capture(32);
    cr_assert(id3 != id && id3 != id2);
}

Test(pystack, a_thread_without_the_gil_asks_the_main_thread_to_resolve)
{
    chain(3, CODE3, OFF3);
    attached = false;
    uint32_t id = shim_pystack_capture(32);
    AT(&frames[0], 56, uintptr_t) += 2;
    shim_pystack_capture(32);
    cr_assert_eq(pending_calls, 1, "one pending call at a time");
    shim_pyframe f[8];
    shim_pystack_frames(id, f, 8);
    cr_assert_str_eq(f[0].function, "<unknown>", "not resolved without the GIL");
    attached = true;                                /* the main thread runs it */
    cr_assert_eq(pending_fn(NULL), 0);
    attached = false;
    shim_pystack_frames(id, f, 8);
    cr_assert_str_eq(f[0].function, "f0");
    AT(&frames[0], 56, uintptr_t) += 2;
    shim_pystack_capture(32);
    cr_assert_eq(pending_calls, 2, "scheduled again once the last one ran");
}

Test(pystack, references_are_held_with_the_gil_and_given_back_at_the_gate)
{
    chain(3, CODE3, OFF3);
    uint32_t id = shim_pystack_capture(32);
    for (int k = 0; k < 3; k++)
        shim_pystack_capture(32);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(refs[i], 1, "code %d: one reference per frame, not per capture", i);
    cr_assert_not_null(finalize_fn, "registered with python_gc's gate");
    finalize_fn();
    for (int i = 0; i < 3; i++)
        cr_assert_eq(refs[i], 0);
    shim_pyframe f[8];
    cr_assert_eq(shim_pystack_frames(id, f, 8), 3);
    cr_assert_str_eq(f[2].function, "f2");

    /* After the gate: no references; with the GIL, resolved on the spot. */
    AT(&frames[0], 56, uintptr_t) += 2;
    uint32_t late = shim_pystack_capture(32);
    cr_assert_eq(refs[0], 0);
    cr_assert_str_eq((shim_pystack_frames(late, f, 8), f[0].function), "f0");
    AT(&frames[0], 56, uintptr_t) += 2;
    attached = false;
    uint32_t late2 = shim_pystack_capture(32);
    attached = true;
    cr_assert_str_eq((shim_pystack_frames(late2, f, 8), f[0].function), "<unknown>");

    /* The gate saw finalization end; the interpreter is up again. */
    gate_cycles++;
    uint32_t next = shim_pystack_capture(32);
    cr_assert(next != late2, "a new lifetime does not share stacks with the old one");
    cr_assert_eq(refs[0], 1);
    finalize_fn();
    cr_assert_eq(refs[0], 0);
}

Test(pystack, no_reference_to_a_subinterpreters_code)
{
    chain(3, CODE3, OFF3);
    AT(tstate, 16, uintptr_t) = (uintptr_t)interp_sub;
    cr_assert_neq(shim_pystack_capture(32), 0);
    cr_assert_eq(refs[0] + refs[1] + refs[2], 0);
}

Test(pystack, threads_without_the_gil_are_not_walked_once_finalization_starts)
{
    chain(3, CODE3, OFF3);
    finalizing = true;
    attached = false;
    cr_assert_eq(shim_pystack_capture(32), 0);
    attached = true;
    cr_assert_neq(shim_pystack_capture(32), 0, "the finalizing thread's own frames still are");
}

Test(pystack, the_tables_are_bounded)
{
    static const int code_of[] = { 0 };
    int off[1];
    uint32_t last = 0;
    int recorded = 0;
    for (int i = 0; i < 3 * MAX_STACKS; i++) {
        off[0] = i;
        chain(1, code_of, off);
        uint32_t id = shim_pystack_capture(32);
        if (id) {
            recorded++;
            cr_assert_gt(id, last);
            last = id;
        }
    }
    cr_assert_eq(recorded, MAX_STACKS);
    cr_assert_eq(warnings, 1, "one warning when full, not one per stack");
    off[0] = 0;
    chain(1, code_of, off);
    cr_assert_eq(shim_pystack_capture(32), 1, "stacks seen before are still found");
}

Test(pystack, pypy_gets_no_python_stack)
{
    kind = SHIM_PY_PYPY;
    chain(3, CODE3, OFF3);
    cr_assert_eq(shim_pystack_capture(32), 0);
    cr_assert_eq(warnings, 0, "PyPy is expected, not warned about");
}

/* 3.12: each call of the evaluation loop pushes a C-stack entry frame
 * (owner FRAME_OWNED_BY_CSTACK) below the frames it runs. */
Test(pystack, marks_the_frame_each_evaluation_loop_call_was_entered_with)
{
    static const int code_of[] = { 0, 1, 2, 3, 4, 5 }, off[] = { 1, 1, 1, 1, 1, 1 };
    chain(6, code_of, off);
    AT(&frames[2], 70, uint8_t) = 3;                /* entry frame of the inner call */
    AT(&frames[5], 70, uint8_t) = 3;                /* entry frame of the outer call */
    shim_pyframe f[8];
    uint32_t id = shim_pystack_capture(32);
    cr_assert_eq(shim_pystack_frames(id, f, 8), 4);
    static const bool want[] = { false, true, false, true };
    for (int i = 0; i < 4; i++)
        cr_assert_eq(f[i].entry, want[i], "frame %d (%s)", i, f[i].function);
    cr_assert_eq(shim_pystack_flags(id), 0);

    /* Same frames, one call: another stack. */
    AT(&frames[2], 70, uint8_t) = 0;
    AT(&frames[2], 0, uintptr_t) = (uintptr_t)&codes[2];
    uint32_t one = shim_pystack_capture(32);
    cr_assert_eq(shim_pystack_frames(one, f, 8), 5);
    cr_assert(!f[1].entry && f[4].entry);

    /* A call whose frames are all skipped (not yet past RESUME): unsure. */
    AT(&frames[2], 70, uint8_t) = 3;
    AT(&codes[0], 176, int32_t) = 4;
    AT(&codes[1], 176, int32_t) = 4;
    uint32_t gap = shim_pystack_capture(32);
    cr_assert_eq(shim_pystack_flags(gap) & SHIM_PYSTACK_UNSURE, SHIM_PYSTACK_UNSURE);
    AT(&codes[0], 176, int32_t) = 0;
    AT(&codes[1], 176, int32_t) = 0;

    /* Cut at the depth asked. */
    uint32_t cut = shim_pystack_capture(2);
    cr_assert_eq(shim_pystack_flags(cut), SHIM_PYSTACK_TRUNCATED);
    cr_assert_neq(cut, id);
}

/* Marks past the first 64 frames: stacks compare them a word of the
 * bitmap at a time, so the same frames divided into other calls must
 * still be another stack whichever word the difference is in. */
Test(pystack, entry_marks_beyond_64_frames_are_part_of_the_stack)
{
    enum { KEPT = 140 };
    static const int second[2] = { 99, 119 };
    uint32_t ids[2];
    for (int v = 0; v < 2; v++) {
        static int code_of[NFRAME], off[NFRAME];
        bool cstack[NFRAME] = { false };
        int n = 0;
        for (int k = 0; k < KEPT; k++) {
            code_of[n] = k % NCODE;
            off[n++] = k;
            if (k == 9 || k == second[v] || k == KEPT - 1) {
                code_of[n] = 0;
                off[n] = 0;
                cstack[n++] = true;      /* the entry frame below call's outermost */
            }
        }
        chain(n, code_of, off);
        for (int i = 0; i < n; i++)
            if (cstack[i])
                AT(&frames[i], 70, uint8_t) = 3;
        ids[v] = shim_pystack_capture(256);
        cr_assert_neq(ids[v], 0);
        cr_assert_eq(shim_pystack_capture(256), ids[v], "the same stack is one id");
        shim_pyframe f[KEPT];
        cr_assert_eq(shim_pystack_frames(ids[v], f, KEPT), KEPT);
        for (int k = 0; k < KEPT; k++)
            cr_assert_eq(f[k].entry, k == 9 || k == second[v] || k == KEPT - 1, "stack %d frame %d",
                         v, k);
        cr_assert_eq(shim_pystack_flags(ids[v]), 0);
    }
    cr_assert_neq(ids[0], ids[1], "other calls, another stack");
}

/* ---- the pipe fallback of checked reads (pyframes.c) ------------------- */

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "pyframes.h"

/* The descriptors of this process that are pipes, lowest first. */
static int pipe_fds_now(int *out, int max)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char link[64], path[300];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t l = readlink(path, link, sizeof link - 1);
        if (l > 0 && (link[l] = 0, strncmp(link, "pipe:", 5) == 0) && n < max)
            out[n++] = atoi(e->d_name);
    }
    closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            int t = out[j]; out[j] = out[j - 1]; out[j - 1] = t;
        }
    return n;
}

Test(pyframes_pipe, opens_on_first_use_and_never_writes_into_a_reused_number)
{
    static const char src[17] = "0123456789abcdef";
    char got[16];
    int before[64], after[64];
    int nb = pipe_fds_now(before, 64);
    cr_assert(shim_pyframes_pipe_read(got, (uintptr_t)src, 16));
    cr_assert_eq(memcmp(got, src, 16), 0);
    int na = pipe_fds_now(after, 64);
    cr_assert_eq(na, nb + 2, "the pipe is created on first use, not before");
    int mine[2], k = 0;
    for (int i = 0; i < na && k < 2; i++) {
        bool old = false;
        for (int j = 0; j < nb; j++)
            old |= before[j] == after[i];
        if (!old)
            mine[k++] = after[i];
    }
    cr_assert_not(shim_pyframes_pipe_read(got, 8, 8), "an unmapped address is an error");

    /* The program closes our descriptors; its next files get low numbers,
     * never ours (kept high: shim/base/ownfd.c). It then puts a file of its
     * own at both numbers (dup2, or as many files as it takes). */
    close(mine[0]);
    close(mine[1]);
    char path[] = "/tmp/spyreshim_pipe_reuse_XXXXXX";
    int low = mkstemp(path);
    cr_assert(low >= 0 && low < mine[0] && low < mine[1],
              "the pipe (%d %d) is not above the program's next number (%d)", mine[0], mine[1],
              low);
    int f1 = dup2(low, mine[0]);
    int f2 = open(path, O_RDWR | O_CLOEXEC);
    cr_assert(f2 >= 0);
    cr_assert_eq(dup2(f2, mine[1]), mine[1]);
    close(f2);
    close(low);
    f2 = mine[1];
    unlink(path);
    cr_assert_eq(f1, mine[0]);
    cr_assert(shim_pyframes_pipe_read(got, (uintptr_t)src + 1, 8));
    cr_assert_eq(memcmp(got, src + 1, 8), 0);
    struct stat st;
    cr_assert_eq(fstat(f1, &st), 0);
    cr_assert_eq(st.st_size, 0, "the shim wrote into the program's file");
    cr_assert_eq(lseek(f1, 0, SEEK_CUR), 0);
    cr_assert_eq(lseek(f2, 0, SEEK_CUR), 0, "the shim read from the program's file");
    cr_assert_neq(fcntl(f1, F_GETFD), -1, "the shim closed the program's descriptor");
    cr_assert_neq(fcntl(f2, F_GETFD), -1, "the shim closed the program's descriptor");
    close(f1);
    close(f2);
}

/* ---- fork while another thread holds the pipe lock ------------------- */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* This binary's write(): the pipe read's write holds the pipe lock; when
 * asked, it stays inside until a fork has begun (a prepare handler says
 * so), so that the fork happens while another thread holds the lock. */
static _Atomic int hold_next_write, inside_write, fork_begun;

ssize_t write(int fd, const void *buf, size_t n)
{
    if (atomic_load(&hold_next_write) && atomic_exchange(&hold_next_write, 0)) {
        atomic_store(&inside_write, 1);
        for (int i = 0; i < 100000 && !atomic_load(&fork_begun); i++)
            usleep(100);
    }
    return syscall(SYS_write, fd, buf, n);
}

static void note_fork_begun(void)
{
    atomic_store(&fork_begun, 1);
}

static void *read_through_the_pipe(void *unused)
{
    (void)unused;
    static const char src[16] = "fork-pipe-lock!";
    char got[16];
    return (void *)(uintptr_t)shim_pyframes_pipe_read(got, (uintptr_t)src, 16);
}

Test(pyframes_pipe, a_fork_while_another_thread_holds_the_pipe_lock)
{
    /* The fork policy's handlers for this room (shim/process/fork.c), then
     * ours, whose prepare runs first (glibc runs them in reverse). */
    pthread_atfork(shim_pystack_atfork_prepare, shim_pystack_atfork_parent,
                   shim_pystack_atfork_child);
    pthread_atfork(note_fork_begun, NULL, NULL);
    atomic_store(&hold_next_write, 1);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, read_through_the_pipe, NULL), 0);
    while (!atomic_load(&inside_write))
        usleep(100);
    pid_t pid = fork();
    if (pid == 0) {
        /* One thread here: an inherited held lock would hang this read. */
        alarm(20);
        static const char src[16] = "the child reads";
        char got[16];
        _exit(shim_pyframes_pipe_read(got, (uintptr_t)src, 16) && memcmp(got, src, 16) == 0
                  ? 0 : 1);
    }
    cr_assert_gt(pid, 0);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    void *ok;
    pthread_join(t, &ok);
    cr_assert(ok, "the other thread's read failed");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child could not read through its pipe (status %#x: it hung on the pipe "
              "lock inherited held)", status);
}
