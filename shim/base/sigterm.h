/* SIGTERM while a trace is recorded (sigterm.c): the shim's handler
 * flushes, then the program's own handling proceeds; the program sees its
 * own disposition in every query (hooks/signals.c intercepts the entry
 * points that set or read it). */
#ifndef SHIM_SIGTERM_H
#define SHIM_SIGTERM_H

#include <signal.h>
#include <stdbool.h>

/* The C library's struct, under a name of ours: the shim exports the
 * function of the same name (hooks/signals.c), which this room never calls. */
typedef struct sigaction shim_sigaction;

/* What the handler runs first: `dies` when the program's disposition is
 * the default action (the process ends by SIGTERM right after). Must be
 * async-signal-safe and bounded. */
typedef void (*shim_sigterm_flush_fn)(bool dies);

/* From the constructor (trace.c) when a trace is recorded: remembers the
 * program's disposition of SIGTERM and, unless it is SIG_IGN, puts the
 * shim's handler in its place. */
void shim_sigterm_install(shim_sigterm_flush_fn flush);
/* Whether calls about `sig` go through the program's recorded disposition
 * (SIGTERM once installed) rather than straight to the C library. */
bool shim_sigterm_owned(int sig);
/* sigaction(SIGTERM, act, old) as the program sees it: `old` is its own
 * disposition; `act` becomes its disposition, exactly as the C library and
 * the kernel record it. 0, or -1 with errno (EINVAL) as sigaction. */
int shim_sigterm_sigaction(const shim_sigaction *act, shim_sigaction *old);
/* siginterrupt(SIGTERM, flag)'s record, for signal()'s SA_RESTART (the C
 * library keeps it for itself: its signal() reads it). */
void shim_sigterm_set_interrupt(bool flag);
bool shim_sigterm_interrupts(void);
/* fork() child: the lock over the record, had another thread held it. */
void shim_sigterm_atfork_child(void);

#endif
