/* Names as they are first seen (tracenames.c): symbols of the native
 * frames and the Python stacks the trace's file holds, as metadata
 * records, each once per file. */
#ifndef SHIM_TRACENAMES_H
#define SHIM_TRACENAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tracefile.h"

/* Adds to m one symbol record per return address of the native stacks
 * `nstacks[0..nids)` that the file has not been given, and one Python
 * stack record (and its marks) per Python stack of the file's first
 * `sites_in_file` sites not given yet whose frames are resolved (all of
 * them when `final`: at exit). Calls the loader (symbolization): never
 * with a lock of ours held; one caller at a time (the names token). */
void shim_tracenames_add(struct trace_meta_buf *m, const uint32_t *nstacks, size_t nids,
                         uint32_t sites_in_file, bool final);
/* fork() child: its file is given every name again. */
void shim_tracenames_atfork_child(void);

#endif
