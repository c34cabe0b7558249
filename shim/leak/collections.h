/* What each collection run for a pressure event freed, by allocation site
 * (the leak report's "collections" section). See collections.c. */
#ifndef SHIM_COLLECTIONS_H
#define SHIM_COLLECTIONS_H

#include <stdbool.h>
#include <stddef.h>

/* From shim_leak_init (the constructor), only when leak checking is on:
 * registers the collection watch with the pressure event. */
void shim_collections_init(void);
/* The section's JSON object (malloc'ed text), or NULL when it was never
 * initialized (leak checking off) or out of host memory. No shim lock held; resolves names. */
char *shim_collections_json(void);
/* The site whose blocks collections freed most, as "file:line in function
 * (N bytes freed by collections)" in `out`; false when there is none
 * (leak checking off, nothing freed). No shim lock held; resolves names. */
bool shim_collections_top_site(char *out, size_t n);
/* fork (shim/process/fork.c): the books' leaf lock. */
void shim_collections_atfork_prepare(void);
void shim_collections_atfork_parent(void);
void shim_collections_atfork_child(void);

#endif
