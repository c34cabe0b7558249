/* CPython's frame layouts, per version, as out-of-process profilers read
 * them: enough to walk a thread's frame chain without the GIL and without
 * touching a reference count. Internal to pystack.c. */
#ifndef SHIM_PYFRAMES_H
#define SHIM_PYFRAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "find.h"

/* One frame as read from memory. `name`, `name_hash`, `file` and
 * `firstlineno` are read only to recognize the code object later: its
 * address may be reused, and so may its name's; the name's hash is
 * content, cached in every str from 3.8 on (code names are interned, so
 * the hash is always computed). */
typedef struct shim_pyrawframe {
    uintptr_t code;
    uintptr_t name;          /* co_name */
    intptr_t name_hash;      /* co_name's cached hash */
    uintptr_t file;          /* co_filename */
    int32_t offset;          /* instruction offset in bytes (PyCode_Addr2Line's unit) */
    int32_t firstlineno;
} shim_pyrawframe;

enum shim_pyinstr {
    SHIM_PYINSTR_LASTI_BYTES,   /* 3.8, 3.9: int f_lasti, in bytes */
    SHIM_PYINSTR_LASTI_UNITS,   /* 3.10: int f_lasti, in 2-byte code units */
    SHIM_PYINSTR_POINTER,       /* 3.11+: pointer into co_code_adaptive */
};

typedef struct shim_pylayout {
    int minor;                   /* 3.<minor> */
    bool free_threaded;
    bool check_refcnt;           /* ob_refcnt is one plain word at offset 0 */
    size_t ob_type;              /* PyObject.ob_type */
    size_t str_hash;             /* PyASCIIObject.hash */
    uintptr_t code_type;         /* &PyCode_Type */
    uintptr_t frame_type;        /* &PyFrame_Type (3.8-3.10 frames are objects) */
    /* Thread state to innermost frame: tstate->ts_frame, then, on 3.11 and
     * 3.12, ->cf_current (the _PyCFrame step); cf_current < 0 when none. */
    size_t ts_frame;
    ptrdiff_t cf_current;
    size_t ts_interp;            /* PyThreadState.interp */
    /* 3.15+: PyThreadState.base_frame, the frame every chain ends with
     * (not a Python function's, not a call's); < 0 before. */
    ptrdiff_t ts_base_frame;
    /* Frame. fr_owner < 0 when frames have no owner byte. */
    size_t fr_back, fr_code, fr_instr;
    ptrdiff_t fr_owner;
    /* 3.11's _PyInterpreterFrame.is_entry (the frame a call of the
     * evaluation loop began with), always fr_owner - 1: the walk reads
     * both in one load; < 0 in other versions. */
    ptrdiff_t fr_entry;
    enum shim_pyinstr instr;
    /* Code object. co_qualname < 0 before 3.11; co_code_adaptive and
     * co_firsttraceable only where instr is SHIM_PYINSTR_POINTER. */
    size_t co_firstlineno, co_filename, co_name;
    ptrdiff_t co_qualname;
    size_t co_code_adaptive, co_firsttraceable;
    /* f_executable is a _PyStackRef from 3.14 (tag bits: the object is
     * bits & exec_mask, bits equal to the tag alone mean none); ~0 before. */
    uintptr_t exec_mask;
    /* Thread-local bytecode (free-threaded 3.14+): PyCodeObject.co_tlbc and
     * _PyInterpreterFrame.tlbc_index; < 0 where there is none. */
    ptrdiff_t co_tlbc, fr_tlbc_index;
    const char *source;          /* "built-in table" or "_Py_DebugOffsets" */
} shim_pylayout;

/* Fills *L for interpreter `py`; reads a few process-global symbols.
 * 3.8 to 3.12 from the built-in table; from 3.13 on from the offsets the
 * runtime publishes (_Py_DebugOffsets at the start of _PyRuntime), and
 * only with `published` (without, tests check the table alone: 3.13 and
 * later then fail). Returns 0, or -1 with a one-line reason in *why (an
 * unsupported version, PyPy, a missing symbol, a wrong cookie, an unknown
 * or inconsistent _Py_DebugOffsets, a layout that does not match the
 * running build). */
int shim_pyframes_layout(const shim_python *py, shim_pylayout *L, bool published,
                         const char **why);
/* The same from the _Py_DebugOffsets at address `debug_offsets` (3.13+;
 * tests hand it a synthetic one). */
int shim_pyframes_layout_at(const shim_python *py, uintptr_t debug_offsets, shim_pylayout *L,
                            const char **why);

/* What a walk learned besides the frames. */
typedef struct shim_pywalk {
    bool clean;        /* ended where a chain ends (no caller) or at `max`,
                          not at a pointer that failed validation */
    bool truncated;    /* stopped at `max` with frames left */
    bool unsure;       /* the frames' division into calls of the evaluation
                          loop is not known for certain (a call whose frames
                          were all skipped, a chain that ends mid-call) */
} shim_pywalk;

/* Walks the frame chain of thread state `tstate`, innermost first, into
 * out[0..max), and sets bit i of the bitmap `entry` (max bits, cleared
 * here) when out[i] is the outermost frame that
 * one call of the interpreter's evaluation loop (_PyEval_EvalFrameDefault)
 * ran, i.e. the frame that call was entered with from C: every frame
 * before 3.11, 3.11's is_entry frames, and from 3.12 the frame below which
 * the chain holds the C-stack entry frame that call pushed. Stops at the
 * first pointer that fails validation, so a wrong layout yields a short
 * stack. With `safe`, every read goes through the kernel (an unmapped
 * address gives an error, not a fault): slow, for checking a layout.
 * Returns the number of frames. */
unsigned shim_pyframes_walk(const shim_pylayout *L, uintptr_t tstate, shim_pyrawframe *out,
                            uint64_t *entry, unsigned max, bool safe, shim_pywalk *w);

/* Whether `f.code` still is the code object that was read: a live code
 * object with the same name, file and first line. Reads through the kernel,
 * so a freed and unmapped object gives false, not a fault. */
bool shim_pyframes_still_alive(const shim_pylayout *L, const shim_pyrawframe *f);

/* The code object's name (co_qualname where it exists) and file objects;
 * the caller holds the GIL and has checked the object. */
uintptr_t shim_pyframes_name_obj(const shim_pylayout *L, uintptr_t code);
uintptr_t shim_pyframes_file_obj(const shim_pylayout *L, uintptr_t code);

/* safe_copy's fallback where process_vm_readv is refused: n (<= 64) bytes
 * at addr through a pipe; false when not mapped. Its pipe is created on
 * first use and survives its descriptors being closed (and the numbers
 * reused) under it. Exposed for tests. */
bool shim_pyframes_pipe_read(void *dst, uintptr_t addr, size_t n);
/* fork(): the pipe lock is taken in prepare (after the pystack interning
 * lock: it is a leaf) and released in parent and child; its holder holds it
 * for one non-blocking write and read. The child makes a pipe of its own. */
void shim_pyframes_atfork_prepare(void);
void shim_pyframes_atfork_parent(void);
void shim_pyframes_atfork_child(void);

#endif
