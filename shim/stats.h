/* Statistics output (stats.c). */
#ifndef SHIM_STATS_H
#define SHIM_STATS_H

#include <stddef.h>

/* SPYRESHIM_STATS file and the info summary; from the library destructor. */
void shim_stats_at_exit(void);
/* Expands %p (pid) and %% in a path template. 0, or -1 when too long. */
int shim_expand_path(const char *tmpl, char *out, size_t cap);

#endif
