/* Native stacks: capture with libunwind (loaded privately) and interning of
 * frame arrays into 32-bit ids. See stack.c. */
#ifndef SHIM_STACK_H
#define SHIM_STACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHIM_STACK_MAX_DEPTH 256

/* Loads libunwind privately and warms it up (the first unwind of a thread
 * is slow). Idempotent. false when libunwind is unavailable: captures then
 * return 0. */
bool shim_stack_init(void);
/* Interned native stack of the calling thread: the caller of the shim's
 * outermost frame first (innermost first), at most `max_depth` frames.
 * 0 when nothing was recorded. Lock-free when the stack was seen before. */
uint32_t shim_stack_capture(unsigned max_depth);
/* Interns `n` return addresses (innermost first). 0 when n == 0 or the
 * table is full. */
uint32_t shim_stack_intern(const uintptr_t *frames, size_t n);
/* The frames of stack `id`; returns their number (0 for an unknown id).
 * The array stays valid for the life of the process. */
size_t shim_stack_frames(uint32_t id, const uintptr_t **frames);
/* Distinct stacks interned so far. */
size_t shim_stack_count(void);
/* fork(): the interning lock is held across fork by the caller's thread. */
void shim_stack_atfork_prepare(void);
void shim_stack_atfork_parent(void);
void shim_stack_atfork_child(void);

#endif
