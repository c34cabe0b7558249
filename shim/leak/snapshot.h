/* The snapshot of live allocations as the shim's own callers take it (the
 * public API is spyreshim.h's). See snapshot.c. */
#ifndef SHIM_SNAPSHOT_H
#define SHIM_SNAPSHOT_H

#include <stdint.h>

#include "spyreshim.h"

/* spyreshim_snapshot_take, also giving the time the allocator locks were
 * held while the live records were copied: in all (*held_ns) and the
 * longest one hold (*longest_ns), which bounds how long an allocating
 * thread was stopped (`spyreshim snapshot PID`, shim/leak/control.c). */
spyreshim_snapshot *shim_snapshot_take_timed(spyreshim_mark since, uint64_t *held_ns,
                                             uint64_t *longest_ns);

#endif
