/* The status the program passed to exit(3) (or returned from main), for
 * the leak verdict at exit: a program that already failed keeps its own
 * status (shim/leak/leak.c). */
#ifndef SHIM_EXITSTATUS_H
#define SHIM_EXITSTATUS_H

#include <stdbool.h>

/* Registers the handler that records the status, once per process (a
 * forked child inherits it). Call it once the program's main has begun
 * (from an allocation, not from the constructor): see exitstatus.c. Takes
 * no lock of ours; registration itself takes the C library's. */
void shim_exitstatus_watch(void);

/* The status given to exit(3), once exit has begun and the handler ran;
 * false when it is not known (watch never called, or called too early for
 * its handler to run before the shim's destructor). */
bool shim_exitstatus_get(int *status);

#endif
