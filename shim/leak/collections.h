/* What each collection run for a pressure event freed, by allocation site
 * (the leak report's "collections" section). See collections.c. */
#ifndef SHIM_COLLECTIONS_H
#define SHIM_COLLECTIONS_H

/* From shim_leak_init (the constructor), only when leak checking is on:
 * registers the collection watch with the pressure event. */
void shim_collections_init(void);
/* The section's JSON object (malloc'ed text), or NULL when it was never
 * initialized (leak checking off) or out of host memory. No shim lock held; resolves names. */
char *shim_collections_json(void);
/* fork (shim/process/fork.c): the books' leaf lock. */
void shim_collections_atfork_prepare(void);
void shim_collections_atfork_parent(void);
void shim_collections_atfork_child(void);

#endif
