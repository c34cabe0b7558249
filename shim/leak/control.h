/* The control socket (SPYRESHIM_CONTROL=1) on which `spyreshim snapshot
 * PID` asks for the live allocations. See control.c. */
#ifndef SHIM_CONTROL_H
#define SHIM_CONTROL_H

/* From the library constructor: opens the socket and starts the control
 * thread when SPYRESHIM_CONTROL=1 (not in secure mode). */
void shim_control_init(void);
/* fork (shim/process/fork.c): the child closes the parent's socket. */
void shim_control_atfork_child(void);

#endif
