/* Test and benchmark harness for python_gc/pystack.c, loaded with ctypes by
 * tests/integration/test_pystack.py and bench/pystack_capture.py into the
 * interpreter under test: ctypes.PyDLL calls keep the GIL, ctypes.CDLL
 * calls release it around the call, the two cases capture must handle.
 *
 * It links pystack.c and pyframes.c alone, with minimal stand-ins for the
 * interpreter discovery (symbols are global in a `python` process), the
 * log and the finalization gate (the test calls it from an atexit
 * handler), so it tests capture and resolution by themselves; the
 * end-to-end path through libspyreshim.so is tested with leak reports. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "find.h"
#include "gate.h"
#include "log.h"
#include "pyframes.h"
#include "pystack.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- stand-ins ---- */

static shim_python the_python;

const shim_python *shim_python_find(void)
{
    if (the_python.kind != SHIM_PY_NONE)
        return &the_python;
    if (dlsym(RTLD_DEFAULT, "PyPyGILState_Ensure")) {
        the_python.kind = SHIM_PY_PYPY;
        return &the_python;
    }
    const char *(*version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "Py_GetVersion");
    if (!version)
        return NULL;
    if (sscanf(version(), "%d.%d.%d", &the_python.major, &the_python.minor, &the_python.micro) != 3)
        return NULL;
    Dl_info info;
    if (dladdr((void *)version, &info))
        the_python.path = info.dli_fname;
    the_python.kind = SHIM_PY_CPYTHON;
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
    return dlsym(RTLD_DEFAULT, name);
}

static void (*finalize_fn)(void);
static unsigned long cycles;

void shim_gate_at_finalize(void (*fn)(void))
{
    finalize_fn = fn;
}

unsigned long shim_gate_cycles(void)
{
    return cycles;
}
/* shim_pystack_resolve_detached's gate: closed here (it is the control
 * thread's, tested through the library in tests/integration/test_snapshot.py). */
enum shim_gate_verdict shim_gate_enter(const shim_pyapi *api) { (void)api; return SHIM_GATE_REFUSE; }
void shim_gate_leave(void) {}
int shim_gate_arm(const shim_pyapi *api) { (void)api; return -1; }

void shim_log(enum shim_log_level level, const char *fmt, ...)
{
    if (level < SHIM_LOG_WARN && !getenv("PYSTACK_TEST_DEBUG"))
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("spyreshim: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

int shim_log_enabled(enum shim_log_level level)
{
    return level >= SHIM_LOG_WARN;
}

/* ---- what the test calls ---- */

EXPORT unsigned pystack_test_capture(unsigned depth)
{
    return shim_pystack_capture(depth);
}

/* "function\tfile\tline\n" per frame, innermost first, into buf. Returns
 * the stack's depth. */
EXPORT size_t pystack_test_frames(unsigned id, char *buf, size_t size)
{
    shim_pyframe f[256];
    size_t n = shim_pystack_frames(id, f, 256);
    size_t used = 0;
    buf[0] = 0;
    for (size_t i = 0; i < n && i < 256 && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s\t%s\t%d\n", f[i].function, f[i].file, f[i].line);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return n;
}

EXPORT void pystack_test_resolve_all(void)
{
    shim_pystack_resolve_all();
}

/* What python_gc's atexit gate does. Returns -1 when nothing registered. */
EXPORT int pystack_test_finalize(void)
{
    if (!finalize_fn)
        return -1;
    finalize_fn();
    return 0;
}

/* What the gate notes at the end of Py_FinalizeEx: the interpreter's next
 * initialization is a new lifetime. */
EXPORT void pystack_test_next_cycle(void)
{
    cycles++;
}

/* The layout in use, "name value" per line, for comparison with offsets
 * compiled from the interpreter's own headers. */
EXPORT int pystack_test_layout(int published, char *buf, size_t size)
{
    shim_pylayout L;
    const char *why = "";
    if (shim_pyframes_layout(shim_python_find(), &L, published != 0, &why) != 0) {
        snprintf(buf, size, "error %s\n", why);
        return -1;
    }
    snprintf(buf, size,
             "ob_type %zu\nts_interp %zu\nstr_hash %zu\nts_frame %zu\ncf_current %td\nfr_back %zu\nfr_code %zu\n"
             "fr_instr %zu\nfr_owner %td\nco_firstlineno %zu\nco_filename %zu\nco_name %zu\n"
             "co_qualname %td\nco_code_adaptive %zu\nco_firsttraceable %zu\nsource %s\n",
             L.ob_type, L.ts_interp, L.str_hash, L.ts_frame, L.cf_current, L.fr_back, L.fr_code, L.fr_instr, L.fr_owner,
             L.co_firstlineno, L.co_filename, L.co_name, L.co_qualname, L.co_code_adaptive,
             L.co_firsttraceable, L.source);
    return 0;
}

/* The layout from the _Py_DebugOffsets at `addr` (a synthetic copy), as
 * pystack_test_layout; addr 0: the interpreter's own (_PyRuntime). */
EXPORT int pystack_test_layout_at(uintptr_t addr, char *buf, size_t size)
{
    const shim_python *py = shim_python_find();
    shim_pylayout L;
    const char *why = "";
    if (!addr && py)
        addr = (uintptr_t)shim_python_sym(py, "_PyRuntime");
    if (shim_pyframes_layout_at(py, addr, &L, &why) != 0) {
        snprintf(buf, size, "error %s\n", why);
        return -1;
    }
    snprintf(buf, size, "source %s\nts_frame %zu\nfr_owner %td\n", L.source, L.ts_frame, L.fr_owner);
    return 0;
}

/* Nanoseconds per capture of the caller's stack (`depth` frames at most),
 * over `iters` captures. */
EXPORT double pystack_test_bench(unsigned depth, unsigned iters)
{
    struct timespec a, b;
    unsigned sink = 0;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (unsigned i = 0; i < iters; i++)
        sink += shim_pystack_capture(depth);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (sink == 0)
        return -1.0;          /* nothing captured: not a measurement */
    return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / iters;
}
