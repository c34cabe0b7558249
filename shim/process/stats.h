/* Statistics output (stats.c). */
#ifndef SHIM_STATS_H
#define SHIM_STATS_H

#include <stddef.h>

/* SPYRESHIM_STATS file and the info summary; from the library destructor. */
void shim_stats_at_exit(void);

#endif
