/* The snapshot of live allocations as the shim's own callers take it (the
 * public API is spyreshim.h's). See snapshot.c. */
#ifndef SHIM_SNAPSHOT_H
#define SHIM_SNAPSHOT_H

#include <stdint.h>

#include "device.h"
#include "spyreshim.h"

/* spyreshim_snapshot_take, also giving (when `t` is not NULL) the time
 * the allocator locks were held while the live records were copied, in all
 * and the longest one hold, which bounds how long an allocating thread was
 * stopped (`spyreshim snapshot PID`, shim/leak/control.c). */
spyreshim_snapshot *shim_snapshot_take_timed(spyreshim_mark since, shim_live_timing *t);

#endif
