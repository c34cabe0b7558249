/* The lifecycle gate: collections happen only while the interpreter is
 * initialized and not finalizing, and finalization waits for the ones in
 * flight. See gate.c. */
#ifndef SHIM_GATE_H
#define SHIM_GATE_H

#include <stdbool.h>
#include "pyapi.h"

enum shim_gate_verdict {
    SHIM_GATE_ADMIT,        /* armed and open: collect, then shim_gate_leave */
    SHIM_GATE_ADMIT_UNARMED,/* not armed this cycle: collect only after arming
                               it (GIL held, main interpreter), then leave */
    SHIM_GATE_REFUSE,       /* closed: finalization has begun */
};

/* Counts a collection in flight unless the gate is closed. Call after
 * checking that the interpreter is initialized and not finalizing. */
enum shim_gate_verdict shim_gate_enter(const shim_pyapi *api);
void shim_gate_leave(void);
bool shim_gate_is_open(void);

/* With the GIL held, attached to the main interpreter, initialized and not
 * finalizing: registers the Python atexit callback that closes the gate
 * (and the C-level one that notices the end of finalization). Idempotent
 * within a cycle. 0 when the gate is open afterwards. Leaves the error
 * indicator as it found it. */
int shim_gate_arm(const shim_pyapi *api);
/* From any thread, any lock held, no GIL needed: asks the interpreter's main
 * thread to arm the gate at its next opportunity (Py_AddPendingCall), once
 * per cycle. A no-op where that is unsafe (PyPy) or already done. */
void shim_gate_schedule_arm(const shim_pyapi *api);

/* Whether the interpreter's collector is running (a gc.callbacks hook
 * registered when the gate is armed; CPython only): 0 no, 1 on this very
 * thread (pressure raised by a finalizer of that collection: another one
 * could not relieve it), 2 on another thread. */
int shim_gate_collector_running(void);

/* Functions run with the GIL held when the gate closes. */
void shim_gate_on_close(void (*fn)(void));
/* shim_gate_on_close, and arms the gate even in a program that never runs
 * short of memory (for resolving Python frames while they still exist). */
void shim_gate_at_finalize(void (*fn)(void));

/* How long the atexit callback waits for collections in flight. */
void shim_gate_set_wait_ms(unsigned ms);

/* Cycles the gate has seen close (interpreter finalizations). */
unsigned long shim_gate_cycles(void);
void shim_gate_atfork_child(void);

#endif
