/* Leak suppressions: LeakSanitizer's `leak:<pattern>` files. See suppress.c. */
#ifndef SHIM_SUPPRESS_H
#define SHIM_SUPPRESS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct shim_suppressions shim_suppressions;

/* Reads `path` (NULL: an empty set). A file that cannot be read or a bad line
 * gets a one-line warning; the valid lines still apply. NULL only when out of
 * host memory. */
shim_suppressions *shim_suppressions_load(const char *path);
/* The same from text already in memory (tests, the CLI). */
shim_suppressions *shim_suppressions_parse(const char *text, const char *origin);
void shim_suppressions_free(shim_suppressions *s);
size_t shim_suppressions_count(const shim_suppressions *s);
const char *shim_suppressions_pattern(const shim_suppressions *s, size_t i);
/* Index of the first pattern matching any of `names` (NULLs skipped), or -1. */
int shim_suppressions_match(const shim_suppressions *s, const char *const *names, size_t n);
/* LeakSanitizer's template match: `*` matches any run of characters, a
 * leading `^` and a trailing `$` anchor; otherwise a substring match. */
bool shim_suppress_template_match(const char *pattern, const char *str);
/* The process's set, from SPYRESHIM_SUPPRESSIONS (ignored in secure mode),
 * loaded on first use and kept for the life of the process. */
const shim_suppressions *shim_suppressions_active(void);

#endif
