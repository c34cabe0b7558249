/* Names at exit (tracenames.c): symbols of every native frame the trace
 * holds and every Python stack it names, as metadata records. */
#ifndef SHIM_TRACENAMES_H
#define SHIM_TRACENAMES_H

#include "tracefile.h"

/* Adds to m one symbol record per distinct return address of the native
 * stacks written so far, and one Python stack record per distinct Python
 * stack of the sites. Calls the loader (symbolization): never with a lock
 * of ours held. */
void shim_tracenames_add(struct trace_meta_buf *m);

#endif
