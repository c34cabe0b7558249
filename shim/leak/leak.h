/* Leak hunting: stacks of live allocations, reports at exit and on OOM.
 * Capture happens on the allocating thread before the allocator lock is
 * taken; names are resolved at report time. */
#ifndef SHIM_LEAK_H
#define SHIM_LEAK_H

#include "oomverdict.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Called once from the library constructor (after options are parsed).
 * When leak checking is on: loads the unwinder privately and warms it up. */
void shim_leak_init(void);
/* Cheap flag read on the hot path. */
bool shim_leak_enabled(void);
/* Stacks of the calling thread; ids are 0 when nothing was recorded. Called
 * without any allocator lock held. */
void shim_leak_capture(uint32_t *native_stack, uint32_t *python_stack);
/* A request failed for good (callbacks had their turn); no lock held.
 * Cheap on the failing thread: copies the live records (stack ids only) and
 * prints one line, once per process; nothing is resolved. */
void shim_leak_on_oom(const char *runtime, size_t size, const shim_oom_facts *facts);
/* From the library destructor: when the last out-of-memory was not
 * followed by any successful allocation, the full report of what held
 * device memory then (SPYRESHIM_OOM_REPORT groups) and <report>.oom. */
void shim_leak_oom_at_exit(void);
/* From the library destructor, after the interpreter finalized: the report,
 * SPYRESHIM_REPORT, and the exit status. */
void shim_leak_at_exit(void);

#endif
