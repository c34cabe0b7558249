/* CPython frame layouts, 3.8 to 3.12 from a table, 3.13 and later from the
 * interpreter's own _Py_DebugOffsets (free-threaded and debug builds
 * included), and the walk of one thread's frame chain.
 *
 * Owns no state beyond what the caller passes in; takes no lock but the
 * one of a rarely used fallback for checked reads (a leaf). Never
 * calls into Python and never changes a reference count: it only reads
 * memory, so it may run on a thread that released the GIL. It must only
 * ever read the calling thread's own chain (another thread's frames change
 * under it).
 *
 * Up to 3.12 the offsets come from CPython's headers of each version
 * (Include/cpython/pystate.h, Include/cpython/frameobject.h before 3.11,
 * Include/internal/pycore_frame.h from 3.11, Include/cpython/code.h).
 * From 3.13 the runtime publishes them itself (_Py_DebugOffsets at the
 * start of _PyRuntime): every offset is read from there, and only where
 * that struct's fields sit is known per version, so a new patch release
 * needs nothing and a new minor version one row. Offsets within objects are
 * written for the 16-byte object header and shifted by what the running
 * build's header adds (free-threaded builds, Py_TRACE_REFS), which is
 * measured on a known object rather than assumed. The test
 * tests/integration/test_pystack.py compiles the headers of every
 * interpreter on the machine and compares.
 * Locks, their order and fork: docs/locking.md. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#include "mutex.h"
#include "ownfd.h"
#include "pyframes.h"

/* Frames walked at most, whatever `max` says, so that a cycle in a
 * misread chain ends. Frames skipped (shims, incomplete) count too. */
#define WALK_LIMIT 4096

/* Offsets for a 16-byte object header (ob_refcnt, ob_type), 3.8 to 3.12.
 * From 3.13 on there is no table: the interpreter publishes its layout
 * (debug_offsets below). */
typedef struct builtin_layout {
    int minor;
    size_t ts_frame;
    ptrdiff_t cf_current;
    size_t fr_back, fr_code, fr_instr;
    ptrdiff_t fr_owner;
    enum shim_pyinstr instr;
    size_t co_firstlineno, co_filename, co_name;
    ptrdiff_t co_qualname;
    size_t co_code_adaptive, co_firsttraceable;
    bool frames_are_objects;      /* PyFrameObject (before 3.11): header shifts it */
} builtin_layout;

static const builtin_layout builtin_layouts[] = {
    /* minor ts   cf  back code instr owner  instr kind              line file name qual  adapt trace obj */
    {  8,    24,  -1, 24,  32,  104,  -1,    SHIM_PYINSTR_LASTI_BYTES, 40, 104, 112, -1,   0,    0,    true },
    {  9,    24,  -1, 24,  32,  104,  -1,    SHIM_PYINSTR_LASTI_BYTES, 40, 104, 112, -1,   0,    0,    true },
    { 10,    24,  -1, 24,  32,   96,  -1,    SHIM_PYINSTR_LASTI_UNITS, 40, 104, 112, -1,   0,    0,    true },
    { 11,    56,   8, 48,  32,   56,  69,    SHIM_PYINSTR_POINTER,     72, 112, 120, 128, 184,  168,  false },
    { 12,    56,   0,  8,   0,   56,  70,    SHIM_PYINSTR_POINTER,     68, 112, 120, 128, 192,  176,  false },
};

/* _PyInterpreterFrame.owner values (3.11+). The frame a call of the
 * evaluation loop pushes on entry from C has owner 3 in every version that
 * has one: FRAME_OWNED_BY_CSTACK in 3.12 and 3.13, FRAME_OWNED_BY_INTERPRETER
 * from 3.14 (which moved FRAME_OWNED_BY_CSTACK to 4; values above 3 are
 * never a Python function's frame). */
enum { OWNED_BY_THREAD = 0, OWNED_BY_GENERATOR = 1, OWNED_BY_FRAME_OBJECT = 2, OWNED_BY_ENTRY = 3 };

/* Where the fields we read sit inside _Py_DebugOffsets (every field there
 * is a uint64_t), per version of that struct: it grows between minor
 * versions (never within one), so its own version field, checked against
 * the interpreter's, says which row applies. Positions in bytes, counted
 * in CPython's Include/internal/pycore_debug_offsets.h (pycore_runtime.h
 * in 3.13); 0 where the version has no such field. */
typedef struct debug_positions {
    int minor;
    uint16_t ts_size, ts_interp, ts_current_frame, ts_base_frame;
    uint16_t fr_size, fr_previous, fr_executable, fr_instr_ptr, fr_owner, fr_tlbc_index;
    uint16_t co_size, co_filename, co_name, co_qualname, co_firstlineno, co_code_adaptive,
        co_tlbc;
    uint16_t ob_size, ob_type;
    uint16_t str_size, str_length;
    bool stackref;                /* f_executable is a tagged _PyStackRef */
} debug_positions;

static const debug_positions debug_offsets[] = {
    /* minor ts: size interp frame base  fr: size prev exec instr owner tlbc
       co: size file name qual line adapt tlbc  ob: size type  str: size length  stackref */
    { 13, 152, 176, 184, 0,    224, 232, 240, 248, 264, 0,    272, 280, 288, 296, 312, 344, 0,
      352, 360,  536, 552, false },
    { 14, 176, 200, 208, 0,    248, 256, 264, 272, 288, 304,  312, 320, 328, 336, 352, 384, 392,
      400, 408,  616, 632, true },
    { 15, 176, 200, 208, 216,  312, 320, 328, 336, 352, 368,  376, 384, 392, 400, 416, 448, 456,
      464, 472,  712, 728, true },
};

#define DBG_VERSION 8
#define DBG_FREE_THREADED 16

/* The fallback of safe_copy; its own lock, never held across anything.
 * The pipe is created on first need, never at start-up (a process that
 * hands its descriptors to a child, or closes every descriptor it does not
 * know, must not find ours). A program may close our descriptors under us
 * and reuse the numbers: each end is kept high, its identity (device, inode) and the pid
 * that created them are remembered and checked with fstat before every
 * use, so the shim never writes into, reads from or closes a number that
 * is no longer its pipe; a child after fork() makes its own (the parent's
 * is shared with it and would mix their bytes). */
static pthread_mutex_t pipe_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shim_ownfd pipe_ends[2] = {SHIM_OWNFD_NONE, SHIM_OWNFD_NONE};
static pid_t pipe_pid;

/* Under pipe_lock: a usable pipe in pipe_ends, or false. Its ends are
 * kept high and checked before each use (shim/base/ownfd.c): a number the
 * program closed and reused is never written or read. */
static bool pipe_ready(void)
{
    bool ours0 = shim_ownfd_is_ours(&pipe_ends[0]), ours1 = shim_ownfd_is_ours(&pipe_ends[1]);
    if (ours0 && ours1 && pipe_pid == getpid())
        return true;
    /* Close only what is still ours (an inherited copy in a child, or one
     * end of a half-closed pair); a reused number is left alone. */
    shim_ownfd_close(&pipe_ends[0]);
    shim_ownfd_close(&pipe_ends[1]);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
        return false;
    if (shim_ownfd_take(&pipe_ends[0], fds[0]) != 0) {
        close(fds[1]);
        return false;
    }
    if (shim_ownfd_take(&pipe_ends[1], fds[1]) != 0) {
        shim_ownfd_close(&pipe_ends[0]);
        return false;
    }
    pipe_pid = getpid();
    return true;
}

void shim_pyframes_atfork_prepare(void) { shim_mutex_lock(&pipe_lock); }
void shim_pyframes_atfork_parent(void) { shim_mutex_unlock(&pipe_lock); }
void shim_pyframes_atfork_child(void) { shim_mutex_unlock(&pipe_lock); }

bool shim_pyframes_pipe_read(void *dst, uintptr_t addr, size_t n)
{
    shim_mutex_lock(&pipe_lock);
    bool ok = pipe_ready() && write(pipe_ends[1].fd, (const void *)addr, n) == (ssize_t)n &&
              read(pipe_ends[0].fd, dst, n) == (ssize_t)n;
    shim_mutex_unlock(&pipe_lock);
    return ok;
}

/* Reads n bytes at addr through the kernel: false (never a fault) when
 * they are not mapped. process_vm_readv on ourselves needs no privilege;
 * where a sandbox refuses it, writing the bytes into a pipe does the same
 * check. */
static bool safe_copy(void *dst, uintptr_t addr, size_t n)
{
    if (addr == 0)
        return false;
    struct iovec local = { dst, n }, remote = { (void *)addr, n };
    ssize_t r = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (r == (ssize_t)n)
        return true;
    if (r < 0 && errno == EFAULT)
        return false;
    if (n > 64)
        return false;
    return shim_pyframes_pipe_read(dst, addr, n);
}

/* A pointer that can be a heap or data object: non-null, word-aligned,
 * user space. Catches most garbage from a misread field before it is
 * dereferenced. */
static inline bool plausible(uintptr_t p)
{
    return p >= 0x10000 && p < ((uintptr_t)1 << 47) && (p & 7) == 0;
}

static inline bool rd_word(bool safe, uintptr_t addr, uintptr_t *out)
{
    if (safe)
        return safe_copy(out, addr, sizeof *out);
    *out = *(const uintptr_t *)addr;
    return true;
}

static inline bool rd_i32(bool safe, uintptr_t addr, int32_t *out)
{
    if (safe)
        return safe_copy(out, addr, sizeof *out);
    *out = *(const int32_t *)addr;
    return true;
}

static inline bool rd_u8(bool safe, uintptr_t addr, uint8_t *out)
{
    if (safe)
        return safe_copy(out, addr, sizeof *out);
    *out = *(const uint8_t *)addr;
    return true;
}

/* Two adjacent bytes in one load. */
static inline bool rd_2u8(bool safe, uintptr_t addr, uint8_t out[2])
{
    if (safe)
        return safe_copy(out, addr, 2);
    memcpy(out, (const void *)addr, 2);
    return true;
}

static bool read_u64(uintptr_t addr, uint64_t *out)
{
    return safe_copy(out, addr, sizeof *out);
}

/* One field of _Py_DebugOffsets: an offset inside a struct of `size`
 * bytes (or the size itself when size is 0). */
static bool dbg_field(uintptr_t rt, unsigned at, uint64_t size, uint64_t *out)
{
    return at && read_u64(rt + at, out) && (size ? *out < size : *out > 0 && *out <= 65536);
}

/* From 3.13 on: the layout the interpreter publishes in _Py_DebugOffsets
 * (at the start of _PyRuntime, which CPython also places in its own ELF
 * section). Refuses, with the reason, a wrong cookie, a version that is
 * not the interpreter's or whose struct we do not know, and offsets that
 * disagree with the running build (the object header measured on True,
 * the code object's size, the free-threaded flag). */
static int layout_from_debug_offsets(const shim_python *py, uintptr_t rt, shim_pylayout *L,
                                     const char **why)
{
    char cookie[8];
    uint64_t version, ft;
    if (!rt || !safe_copy(cookie, rt, sizeof cookie)) {
        *why = "no _PyRuntime to read _Py_DebugOffsets from";
        return -1;
    }
    if (memcmp(cookie, "xdebugpy", 8) != 0) {
        *why = "_Py_DebugOffsets has the wrong cookie (not \"xdebugpy\")";
        return -1;
    }
    if (!read_u64(rt + DBG_VERSION, &version) || !read_u64(rt + DBG_FREE_THREADED, &ft)) {
        *why = "_Py_DebugOffsets is unreadable";
        return -1;
    }
    int vmajor = (int)((version >> 24) & 0xff), vminor = (int)((version >> 16) & 0xff);
    const debug_positions *D = NULL;
    for (size_t i = 0; i < sizeof debug_offsets / sizeof debug_offsets[0]; i++)
        if (vmajor == 3 && (version >> 32) == 0 && debug_offsets[i].minor == vminor)
            D = &debug_offsets[i];
    if (!D) {
        *why = "_Py_DebugOffsets of an unknown version (3.13 to 3.15 are known)";
        return -1;
    }
    if (vmajor != py->major || vminor != py->minor) {
        *why = "_Py_DebugOffsets names another version than the interpreter's";
        return -1;
    }
    uint64_t ts_size, fr_size, co_size, ob_size, str_size, v[13];
    bool ok = dbg_field(rt, D->ts_size, 0, &ts_size) && dbg_field(rt, D->fr_size, 0, &fr_size) &&
              dbg_field(rt, D->co_size, 0, &co_size) && dbg_field(rt, D->ob_size, 0, &ob_size) &&
              dbg_field(rt, D->str_size, 0, &str_size) &&
              dbg_field(rt, D->ts_interp, ts_size, &v[0]) &&
              dbg_field(rt, D->ts_current_frame, ts_size, &v[1]) &&
              dbg_field(rt, D->fr_previous, fr_size, &v[2]) &&
              read_u64(rt + D->fr_executable, &v[3]) && v[3] < fr_size &&
              dbg_field(rt, D->fr_instr_ptr, fr_size, &v[4]) &&
              dbg_field(rt, D->fr_owner, fr_size, &v[5]) &&
              dbg_field(rt, D->co_filename, co_size, &v[6]) &&
              dbg_field(rt, D->co_name, co_size, &v[7]) &&
              dbg_field(rt, D->co_qualname, co_size, &v[8]) &&
              dbg_field(rt, D->co_firstlineno, co_size, &v[9]) &&
              dbg_field(rt, D->co_code_adaptive, co_size + 1, &v[10]) &&
              dbg_field(rt, D->ob_type, ob_size, &v[11]) &&
              dbg_field(rt, D->str_length, str_size, &v[12]);
    if (!ok) {
        *why = "_Py_DebugOffsets holds an offset outside its struct";
        return -1;
    }
    if (ft > 1 || (ft != 0) != L->free_threaded || v[11] != L->ob_type) {
        *why = "_Py_DebugOffsets disagrees with the running build (object header, free-threaded flag)";
        return -1;
    }
    uint64_t base = 0;
    if (D->ts_base_frame && !dbg_field(rt, D->ts_base_frame, ts_size, &base)) {
        *why = "_Py_DebugOffsets holds an offset outside its struct";
        return -1;
    }
    L->ts_base_frame = base ? (ptrdiff_t)base : -1;
    L->ts_interp = v[0];
    L->ts_frame = v[1];
    L->cf_current = -1;
    L->fr_back = v[2];
    L->fr_code = v[3];
    L->fr_instr = v[4];
    L->fr_owner = (ptrdiff_t)v[5];
    L->co_filename = v[6];
    L->co_name = v[7];
    L->co_qualname = (ptrdiff_t)v[8];
    L->co_firstlineno = v[9];
    L->co_code_adaptive = v[10];
    /* PyASCIIObject: the length, then the hash. */
    L->str_hash = v[12] + 8;
    /* Not published: _co_firsttraceable, then co_extra, then (free-threaded
     * builds of 3.14+) co_tlbc, end the code object's fixed part. */
    uint64_t tlbc = 0, tlbc_index = 0;
    if (ft && D->co_tlbc && (!dbg_field(rt, D->co_tlbc, co_size, &tlbc) ||
                             !dbg_field(rt, D->fr_tlbc_index, fr_size, &tlbc_index))) {
        *why = "_Py_DebugOffsets has no thread-local bytecode offsets in a free-threaded build";
        return -1;
    }
    L->co_tlbc = tlbc ? (ptrdiff_t)tlbc : -1;
    L->fr_tlbc_index = tlbc ? (ptrdiff_t)tlbc_index : -1;
    L->co_firsttraceable = (tlbc ? tlbc : L->co_code_adaptive) - 16;
    L->exec_mask = D->stackref ? ~(uintptr_t)3 : ~(uintptr_t)0;
    L->source = "_Py_DebugOffsets";
    return 0;
}

/* The object header and the type symbols, measured on the running build;
 * common to the table and the published offsets. */
static int measure_header(const shim_python *py, shim_pylayout *L, const char **why)
{
    uintptr_t true_obj = (uintptr_t)shim_python_sym(py, "_Py_TrueStruct");
    uintptr_t bool_type = (uintptr_t)shim_python_sym(py, "PyBool_Type");
    L->code_type = (uintptr_t)shim_python_sym(py, "PyCode_Type");
    L->frame_type = (uintptr_t)shim_python_sym(py, "PyFrame_Type");
    if (!true_obj || !bool_type || !L->code_type || !L->frame_type) {
        *why = "a type symbol is missing";
        return -1;
    }
    /* The object header: ob_type right after ob_refcnt (16-byte header), or
     * after the free-threaded build's thread id, flags and split counts,
     * or after Py_TRACE_REFS's two list pointers (both 32 bytes). True's
     * type is bool, which tells which. */
    uintptr_t t;
    if (safe_copy(&t, true_obj + 8, sizeof t) && t == bool_type)
        L->ob_type = 8;
    else if (safe_copy(&t, true_obj + 24, sizeof t) && t == bool_type)
        L->ob_type = 24;
    else {
        *why = "unrecognized object header";
        return -1;
    }
    size_t shift = L->ob_type - 8;
    /* PyASCIIObject: the header, the length, then the hash. */
    L->str_hash = L->ob_type + 8 + 8;
    L->minor = py->minor;
    L->free_threaded = py->free_threaded || (shift && py->minor >= 13);
    L->check_refcnt = shift == 0;
    L->ts_interp = 16;           /* after prev and next, up to 3.12 */
    L->exec_mask = ~(uintptr_t)0;
    L->co_tlbc = -1;
    L->fr_tlbc_index = -1;
    L->fr_entry = -1;
    L->ts_base_frame = -1;
    return 0;
}

/* What every layout that reads instruction pointers must pass. */
static int check_pointer_layout(shim_pylayout *L, const char **why)
{
    if (L->fr_owner < 0) {
        *why = "no frame owner offset";    /* the walk reads it from 3.11 on */
        return -1;
    }
    /* Code objects are variable-sized with the bytecode last, so the
     * type's basic size is where the bytecode starts: a check of the
     * whole code layout against the running build (tp_basicsize follows
     * the header, ob_size and tp_name). */
    uintptr_t basicsize;
    if (!safe_copy(&basicsize, L->code_type + L->ob_type + 24, sizeof basicsize) ||
        basicsize != L->co_code_adaptive) {
        *why = "code object layout does not match this build";
        return -1;
    }
    return 0;
}

int shim_pyframes_layout_at(const shim_python *py, uintptr_t debug_offsets, shim_pylayout *L,
                            const char **why)
{
    memset(L, 0, sizeof *L);
    if (!py || py->kind != SHIM_PY_CPYTHON || py->major != 3 || py->minor < 13) {
        *why = "_Py_DebugOffsets exist from CPython 3.13 on";
        return -1;
    }
    if (measure_header(py, L, why) != 0 ||
        layout_from_debug_offsets(py, debug_offsets, L, why) != 0)
        return -1;
    L->instr = SHIM_PYINSTR_POINTER;
    return check_pointer_layout(L, why);
}

int shim_pyframes_layout(const shim_python *py, shim_pylayout *L, bool published,
                         const char **why)
{
    memset(L, 0, sizeof *L);
    if (!py || py->kind != SHIM_PY_CPYTHON) {
        *why = "not CPython (PyPy gets native stacks only)";
        return -1;
    }
    if (py->major == 3 && py->minor >= 13) {
        if (!published) {
            *why = "from CPython 3.13 on the layout comes from _Py_DebugOffsets only";
            return -1;
        }
        return shim_pyframes_layout_at(py, (uintptr_t)shim_python_sym(py, "_PyRuntime"), L, why);
    }
    const builtin_layout *B = NULL;
    for (size_t i = 0; i < sizeof builtin_layouts / sizeof builtin_layouts[0]; i++)
        if (py->major == 3 && builtin_layouts[i].minor == py->minor)
            B = &builtin_layouts[i];
    if (!B) {
        *why = "no frame layout for this CPython version (3.8 to 3.12 are built in)";
        return -1;
    }
    if (measure_header(py, L, why) != 0)
        return -1;
    size_t shift = L->ob_type - 8;
    L->ts_frame = B->ts_frame;
    L->cf_current = B->cf_current;
    L->fr_back = B->fr_back + (B->frames_are_objects ? shift : 0);
    L->fr_code = B->fr_code + (B->frames_are_objects ? shift : 0);
    L->fr_instr = B->fr_instr + (B->frames_are_objects ? shift : 0);
    L->fr_owner = B->fr_owner;
    /* bool is_entry sits right before the owner byte in 3.11 only (3.12
     * marks calls with C-stack entry frames instead). */
    L->fr_entry = py->minor == 11 ? B->fr_owner - 1 : -1;
    L->instr = B->instr;
    L->co_firstlineno = B->co_firstlineno + shift;
    L->co_filename = B->co_filename + shift;
    L->co_name = B->co_name + shift;
    L->co_qualname = B->co_qualname < 0 ? -1 : B->co_qualname + (ptrdiff_t)shift;
    L->co_code_adaptive = B->co_code_adaptive ? B->co_code_adaptive + shift : 0;
    L->co_firsttraceable = B->co_firsttraceable ? B->co_firsttraceable + shift : 0;
    L->source = "built-in table";
    if (L->instr == SHIM_PYINSTR_POINTER)
        return check_pointer_layout(L, why);
    return 0;
}

/* How a layout tells where the calls of the evaluation loop begin, which
 * is also what sets its frame reads apart. The walk is compiled once per
 * kind (and once more for checked reads), so that the per-frame tests of
 * the layout and of `safe` fold away: on 3.11 to 3.13 they cost more than
 * recording the entry marks themselves did (issue 12's capture budget), and
 * 3.14's tag and owner tests would cost 3.12 and 3.13 some 180 instructions
 * a capture of 20 frames (issue 23). */
enum walk_kind {
    WALK_OBJECTS,    /* 3.8-3.10: frames are objects, each its own call */
    WALK_IS_ENTRY,   /* 3.11: the frame's is_entry byte */
    WALK_CSTACK,     /* 3.12, 3.13: a C-stack entry frame below each call's frames */
    WALK_STACKREF,   /* 3.14+: the same, f_executable a tagged _PyStackRef */
    WALK_TLBC,       /* 3.14+ free-threaded: and thread-local bytecode */
};

#define ALWAYS_INLINE inline __attribute__((always_inline))

/* One frame: its code object and instruction offset (1), or 0 when the
 * frame is not a Python function's (an incomplete frame, 3.13's shims:
 * skip it), or -1 for a C-stack entry frame (3.12+: the boundary between
 * two calls of the evaluation loop; skipped too). *entry receives 3.11's
 * is_entry, read whether the frame is kept or not. Every kind but
 * WALK_OBJECTS has an owner byte (shim_pyframes_layout). */
static ALWAYS_INLINE int read_frame(const shim_pylayout *L, uintptr_t fr, bool safe,
                                    enum walk_kind kind, shim_pyrawframe *f, bool *stop,
                                    bool *entry)
{
    uintptr_t code, type;
    uint8_t owner = OWNED_BY_THREAD;
    if (!rd_word(safe, fr + L->fr_code, &code)) {
        *stop = true;
        return 0;
    }
    if (kind >= WALK_CSTACK) {
        if (!rd_u8(safe, fr + (uintptr_t)L->fr_owner, &owner)) {
            *stop = true;
            return 0;
        }
        if (owner == OWNED_BY_ENTRY)
            return -1;
    }
    if (kind >= WALK_STACKREF) {
        if (owner > OWNED_BY_ENTRY)
            return 0;           /* 3.14's FRAME_OWNED_BY_CSTACK: no Python function */
        /* A tagged _PyStackRef; the tag alone is a null reference. */
        code &= L->exec_mask;
        if (code == 0)
            return 0;
    } else if (kind == WALK_IS_ENTRY) {
        /* 3.11: is_entry is the byte right before owner (layout), read
         * with it; 3.11 has no C-stack entry frames to look for. */
        uint8_t b[2];
        if (!rd_2u8(safe, fr + (uintptr_t)L->fr_entry, b)) {
            *stop = true;
            return 0;
        }
        *entry = b[0] != 0;
        owner = b[1];
    }
    if (!plausible(code) || !rd_word(safe, code + L->ob_type, &type)) {
        *stop = true;
        return 0;
    }
    if (type != L->code_type)
        return 0;               /* 3.13 shim frames hold None */
    int32_t line;
    uintptr_t name, file, hash;
    if (!rd_i32(safe, code + L->co_firstlineno, &line) ||
        !rd_word(safe, code + L->co_name, &name) ||
        !rd_word(safe, code + L->co_filename, &file) ||
        !plausible(name) || !rd_word(safe, name + L->str_hash, &hash)) {
        *stop = true;
        return 0;
    }
    int32_t off;
    if (kind != WALK_OBJECTS) {
        uintptr_t ip;
        int32_t first;
        if (!rd_word(safe, fr + L->fr_instr, &ip) ||
            !rd_i32(safe, code + L->co_firsttraceable, &first)) {
            *stop = true;
            return 0;
        }
        uintptr_t start = code + L->co_code_adaptive;
        /* Free-threaded 3.14+: a thread may run its own copy of the
         * bytecode (entries[tlbc_index] of co_tlbc; entry 0 is
         * co_code_adaptive itself). Offsets within it are the same. */
        if (kind == WALK_TLBC) {
            int32_t idx;
            uintptr_t arr, n, copy;
            if (!rd_i32(safe, fr + (uintptr_t)L->fr_tlbc_index, &idx)) {
                *stop = true;
                return 0;
            }
            if (idx > 0) {
                if (!rd_word(safe, code + (uintptr_t)L->co_tlbc, &arr) || !plausible(arr) ||
                    !rd_word(safe, arr, &n) || (uintptr_t)idx >= n ||
                    !rd_word(safe, arr + 8 + 8 * (uintptr_t)idx, &copy) || !plausible(copy)) {
                    *stop = true;
                    return 0;
                }
                start = copy;
            }
        }
        /* Not yet past its prologue (RESUME): no line to show, and 3.11's
         * and 3.12's own walkers skip it too. Generators' frames are
         * always complete. */
        if (ip < start + 2 * (uintptr_t)(first > 0 ? first : 0)) {
            if (owner != OWNED_BY_GENERATOR || ip < start)
                return 0;
        }
        if (ip - start > (1u << 30))
            return 0;
        off = (int32_t)(ip - start);
    } else {
        int32_t lasti;
        if (!rd_i32(safe, fr + L->fr_instr, &lasti)) {
            *stop = true;
            return 0;
        }
        if (lasti < 0)
            lasti = 0;
        off = L->instr == SHIM_PYINSTR_LASTI_UNITS ? lasti * 2 : lasti;
    }
    f->code = code;
    f->name = name;
    f->name_hash = (intptr_t)hash;
    f->file = file;
    f->firstlineno = line;
    f->offset = off;
    return 1;
}

/* 3.15 ends every thread's chain with a base frame of its own: an entry
 * frame that is no call's, right after the outermost call's entry frame.
 * `base` is the thread state's base_frame (0 where there is none); asked
 * only on the rare boundary that follows another, and only from 3.14 on. */
static ALWAYS_INLINE bool is_base_frame(const shim_pylayout *L, uintptr_t fr, uintptr_t base,
                                        bool safe)
{
    uintptr_t next;
    return fr == base && rd_word(safe, fr + L->fr_back, &next) && next == 0;
}

/* The walk from innermost frame `fr`; `end` is the thread's base frame
 * (3.15+; 0 before); `entry` is cleared. */
static ALWAYS_INLINE unsigned walk(const shim_pylayout *L, uintptr_t fr, uintptr_t end,
                                   shim_pyrawframe *out,
                                   uint64_t *entry, unsigned max, bool safe,
                                   enum walk_kind kind, shim_pywalk *w)
{
    /* Frames kept since the last boundary between calls: a boundary with
     * none means a call whose frames were all skipped, which a splice
     * could not place. */
    bool in_call = false;
    unsigned n = 0;
    for (unsigned steps = 0; steps < WALK_LIMIT; steps++) {
        if (!fr || n == max) {
            w->clean = true;
            w->truncated = fr != 0;
            break;
        }
        if (!plausible(fr))
            break;
        if (kind == WALK_OBJECTS) {
            /* Before 3.11 a frame is an object: check its type too. */
            uintptr_t type;
            if (!rd_word(safe, fr + L->ob_type, &type) || type != L->frame_type)
                break;
        }
        bool stop = false, is_entry = false;
        int r = read_frame(L, fr, safe, kind, &out[n], &stop, &is_entry);
        if (kind == WALK_OBJECTS) {
            /* Each frame is a call of its own, so every kept frame is an
             * entry (all marked at the end, a word at a time) and a frame
             * not kept is a call the splice could not place. */
            if (r > 0)
                n++;
            else
                w->unsure = true;
        } else {
            if (r > 0) {
                n++;
                in_call = true;
            }
            if (r < 0 || is_entry) {
                if (in_call)
                    entry[(n - 1) / 64] |= 1ull << ((n - 1) % 64);
                else if (!(kind >= WALK_STACKREF && r < 0 && !stop &&
                           is_base_frame(L, fr, end, safe)))
                    w->unsure = true;   /* a call whose frames were all skipped */
                in_call = false;
            }
        }
        if (stop || !rd_word(safe, fr + L->fr_back, &fr))
            break;
    }
    if (kind == WALK_OBJECTS) {
        for (unsigned i = 0; i < n / 64; i++)
            entry[i] = ~0ull;
        if (n % 64)
            entry[n / 64] = (1ull << (n % 64)) - 1;
    } else if (in_call && !w->truncated) {
        /* A chain ends with the outermost call's boundary. */
        w->unsure = true;
    }
    return n;
}

unsigned shim_pyframes_walk(const shim_pylayout *L, uintptr_t tstate, shim_pyrawframe *out,
                            uint64_t *entry, unsigned max, bool safe, shim_pywalk *w)
{
    uintptr_t fr;
    w->clean = w->truncated = w->unsure = false;
    for (unsigned i = 0; i < (max + 63) / 64; i++)
        entry[i] = 0;
    if (!plausible(tstate) || !rd_word(safe, tstate + L->ts_frame, &fr))
        return 0;
    if (L->cf_current >= 0) {
        if (!plausible(fr) || !rd_word(safe, fr + (uintptr_t)L->cf_current, &fr))
            return 0;
    }
    /* 3.15's thread base frame (is_base_frame). */
    uintptr_t end = 0;
    if (L->ts_base_frame >= 0 && !rd_word(safe, tstate + (uintptr_t)L->ts_base_frame, &end))
        return 0;
    enum walk_kind kind = L->instr != SHIM_PYINSTR_POINTER ? WALK_OBJECTS
                          : L->fr_entry >= 0               ? WALK_IS_ENTRY
                          : L->fr_tlbc_index >= 0          ? WALK_TLBC
                          : L->exec_mask != ~(uintptr_t)0  ? WALK_STACKREF
                                                           : WALK_CSTACK;
    /* Checked reads cost a system call each: one generic copy will do. */
    if (safe)
        return walk(L, fr, end, out, entry, max, true, kind, w);
    switch (kind) {
    case WALK_OBJECTS:
        return walk(L, fr, end, out, entry, max, false, WALK_OBJECTS, w);
    case WALK_IS_ENTRY:
        return walk(L, fr, end, out, entry, max, false, WALK_IS_ENTRY, w);
    case WALK_STACKREF:
        return walk(L, fr, end, out, entry, max, false, WALK_STACKREF, w);
    case WALK_TLBC:
        return walk(L, fr, end, out, entry, max, false, WALK_TLBC, w);
    default:
        return walk(L, fr, end, out, entry, max, false, WALK_CSTACK, w);
    }
}

bool shim_pyframes_still_alive(const shim_pylayout *L, const shim_pyrawframe *f)
{
    uintptr_t type, name, file, refcnt;
    intptr_t hash;
    int32_t line;
    if (!plausible(f->code) ||
        !safe_copy(&type, f->code + L->ob_type, sizeof type) || type != L->code_type ||
        !safe_copy(&line, f->code + L->co_firstlineno, sizeof line) || line != f->firstlineno ||
        !safe_copy(&name, f->code + L->co_name, sizeof name) || name != f->name ||
        !safe_copy(&hash, name + L->str_hash, sizeof hash) || hash != f->name_hash ||
        !safe_copy(&file, f->code + L->co_filename, sizeof file) || file != f->file)
        return false;
    /* A freed block's first word is the allocator's free-list link, far
     * beyond any real count (immortal objects use 2^32 - 1 or 2^30 at most
     * here). Free-threaded headers split the count: not checked there. */
    if (L->check_refcnt &&
        (!safe_copy(&refcnt, f->code, sizeof refcnt) || refcnt == 0 || refcnt > ((uintptr_t)1 << 33)))
        return false;
    return true;
}

uintptr_t shim_pyframes_name_obj(const shim_pylayout *L, uintptr_t code)
{
    size_t at = L->co_qualname >= 0 ? (size_t)L->co_qualname : L->co_name;
    return *(const uintptr_t *)(code + at);
}

uintptr_t shim_pyframes_file_obj(const shim_pylayout *L, uintptr_t code)
{
    return *(const uintptr_t *)(code + L->co_filename);
}
