/* Python stacks of allocating threads, for leak reports. Capture reads the
 * calling thread's own frame chain (it cannot change while the thread is
 * inside the allocation), with or without the GIL, never touching a
 * reference count without it. Frames are kept as (code object, instruction
 * offset) and resolved to function/file/line later, with the GIL held and
 * before finalization. */
#ifndef SHIM_PYSTACK_H
#define SHIM_PYSTACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct shim_pyframe {
    const char *function;    /* "<unknown>" when it could not be resolved */
    const char *file;
    int line;                /* 0 when unknown */
    /* The outermost frame that one call of the interpreter's evaluation
     * loop (_PyEval_EvalFrameDefault, one native frame) ran: that call was
     * entered from C. Each such call ran the frames from after the
     * previous entry frame down to this one. */
    bool entry;
} shim_pyframe;

/* Flags of a stack (shim_pystack_flags). */
#define SHIM_PYSTACK_TRUNCATED 1u   /* cut at the depth asked: outer frames missing */
#define SHIM_PYSTACK_UNSURE 2u      /* the entry marks may be incomplete */
/* The stack of the thread that started the work, recorded for an
 * allocation made on a thread without Python frames (shim/leak/origin.c):
 * its frames did not call the allocation's native frames. */
#define SHIM_PYSTACK_ORIGIN 4u

/* Interned Python stack of the calling thread, innermost frame first, at
 * most `max_depth` frames; 0 when the thread runs no Python (or on PyPy). */
uint32_t shim_pystack_capture(unsigned max_depth);
/* The frames of stack `id`, innermost first. Returns how many exist (may
 * be more than `max`). Strings stay valid for the life of the process.
 * Resolves what is still unresolved when the interpreter is alive and this
 * thread holds the GIL; otherwise reports what was resolved before. */
size_t shim_pystack_frames(uint32_t id, shim_pyframe *out, size_t max);
/* As shim_pystack_capture, interned apart with SHIM_PYSTACK_ORIGIN set: the
 * calling thread's stack as the origin of work other threads run. */
uint32_t shim_pystack_capture_origin(unsigned max_depth);
/* With the GIL held: resolve every frame seen so far (run at interpreter
 * exit through shim_gate_at_finalize, and by report/snapshot calls). */
void shim_pystack_resolve_all(void);
/* From a thread of the shim's own that never runs Python and holds no lock
 * (the control thread, shim/leak/control.c): when frames wait to be
 * resolved, takes the GIL (PyGILState_Ensure, inside python_gc's lifecycle
 * gate, as the GC thread does) and resolves them. Returns the nanoseconds
 * the GIL was held, the time Python threads were stopped (0: nothing was
 * pending, or the interpreter is not up or is finalizing). */
uint64_t shim_pystack_resolve_detached(void);
/* Whether some frame of stack `id` is still to be resolved in this
 * interpreter lifetime (a later shim_pystack_frames may name it). */
bool shim_pystack_pending(uint32_t id);
/* From a thread of the shim's own, holding no lock (the trace writer):
 * when frames wait to be resolved, asks the interpreter's main thread to
 * resolve them at its next check for pending calls (Py_AddPendingCall:
 * no GIL, no waiting). */
void shim_pystack_resolve_soon(void);
/* SHIM_PYSTACK_* flags of stack `id` (0 for an unknown id). */
unsigned shim_pystack_flags(uint32_t id);
/* The load address of the object that holds the interpreter (libpython,
 * or the executable of a static build), 0 when none was seen: its native
 * frames are the interpreter's own. */
uintptr_t shim_pystack_interpreter_base(void);
/* The exported entry of the interpreter's evaluation loop,
 * _PyEval_EvalFrameDefault (0 when none was seen), for reports that must
 * find its frames where its parts have no symbol. */
uintptr_t shim_pystack_eval_entry(void);
/* Why this process records no Python frames although it runs Python (PyPy,
 * an unknown CPython layout), for reports; NULL when there is no such
 * reason. */
const char *shim_pystack_note(void);

/* fork(): the interning lock, held across fork by the forking thread
 * (shim/process/fork.c). */
void shim_pystack_atfork_prepare(void);
void shim_pystack_atfork_parent(void);
void shim_pystack_atfork_child(void);

#endif
