/* The trace's sites (tracesites.c): a site is a (native stack, Python
 * stack) pair, interned so that an event carries one 32-bit id. */
#ifndef SHIM_TRACESITES_H
#define SHIM_TRACESITES_H

#include <stdint.h>

struct trace_site {
    uint32_t nstack, pystack;
};

/* The id (from 1) of the pair, interned on first sight; 0 for the empty
 * pair or when out of host memory (the event then names no site). Takes
 * the site lock, a leaf. */
uint32_t shim_tracesites_intern(uint32_t nstack, uint32_t pystack);
/* A copy (malloc'd, the caller frees) of the sites with ids first+1 and
 * up, *n of them; NULL with *n = 0 when there are none or no memory. */
struct trace_site *shim_tracesites_since(uint32_t first, uint32_t *n);

/* fork(): the site lock is held across fork; the table is kept (ids stay
 * valid in the child). */
void shim_tracesites_atfork_prepare(void);
void shim_tracesites_atfork_parent(void);
void shim_tracesites_atfork_child(void);

#endif
