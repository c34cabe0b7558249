/* The fork policy (fork.c, docs/locking.md). */
#ifndef SHIM_FORK_H
#define SHIM_FORK_H

/* From the library constructor: installs the process-wide handlers and
 * the hook that installs each device's when it becomes ready. */
void shim_fork_init(void);

#endif
