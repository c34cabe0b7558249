/* Regions forgotten at their context's teardown (forgotten.c). A leaf:
 * its lock is taken under arena locks and takes nothing. */
#ifndef SHIM_FORGOTTEN_H
#define SHIM_FORGOTTEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

/* The runtime freed [addr, addr + size) with its context. */
void shim_forgotten_add(uintptr_t addr, size_t size);
/* The runtime gave [addr, addr + size) out again: no longer forgotten. */
void shim_forgotten_reserved(uintptr_t addr, size_t size);
/* Whether `addr` lies in a forgotten region. */
bool shim_forgotten_contains(uintptr_t addr);
/* fork(): taken in prepare (after the hook resolution lock), released in
 * parent and child (docs/locking.md). */
void shim_forgotten_atfork_prepare(void);
void shim_forgotten_atfork_release(void);

#pragma GCC visibility pop

#endif
