/* Growable host arrays for the allocator's metadata (the arena's nodes, the
 * live table's slots and fields), mapped straight from the kernel.
 *
 * Why not malloc: the arrays reach tens of MiB at a million live blocks.
 * Growing them with mremap moves page tables instead of copying bytes and
 * leaves no stale copy behind in the heap; pages never touched cost no
 * resident memory; and arrays of 4 MiB and more are offered transparent
 * huge pages, because every access to them is at a random index and a TLB
 * miss on top of each cache miss is most of what a page walk costs. */
#ifndef SHIM_HOSTMEM_H
#define SHIM_HOSTMEM_H

#include <stddef.h>

/* Grows (or makes, when old is NULL) an array of old_bytes to new_bytes,
 * keeping its contents; the new tail reads as zeros. Page aligned. NULL
 * when the kernel refuses: the old array is then untouched. */
void *shim_hostmem_grow(void *old, size_t old_bytes, size_t new_bytes);
void shim_hostmem_free(void *p, size_t bytes);
/* The bytes a mapping of `bytes` really takes (whole pages). */
size_t shim_hostmem_size(size_t bytes);

/* A zeroed struct of its own cache lines (released with free()): the
 * structures each arena writes on every operation (its lock, counters,
 * table header) must not share a line with another arena's, or two
 * threads on two arenas would still pass lines back and forth. */
void *shim_hostmem_lines(size_t bytes);

#endif
