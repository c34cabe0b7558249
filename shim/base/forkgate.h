/* The fork gate: walks of the loaded objects (dl_iterate_phdr, and
 * libunwind's unwinding, which walks them on its own) take locks of the
 * loader and of libunwind that no fork handler resets. A fork while another
 * thread is inside one leaves the child holding them forever. Every such
 * walk of the shim is entered through the gate; the fork policy
 * (shim/process/fork.c) closes it in prepare, waiting (bounded) for the
 * walks in flight, and new walks wait (bounded) while a fork is pending. */
#ifndef SHIM_FORKGATE_H
#define SHIM_FORKGATE_H

/* Around one walk. Nests on the same thread. Never blocks longer than the
 * gate's bound; takes no lock. */
void shim_fork_gate_enter(void);
void shim_fork_gate_leave(void);

/* Called by the fork policy only. */
void shim_fork_gate_prepare(void);
void shim_fork_gate_parent(void);
void shim_fork_gate_child(void);

#endif
