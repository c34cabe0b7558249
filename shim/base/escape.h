/* Control characters escaped into one line of text (escape.c). */
#ifndef SHIM_ESCAPE_H
#define SHIM_ESCAPE_H

#include <stddef.h>

/* Copies `s` into out[n] with control characters escaped (\n, \r, \t,
 * \xNN), truncated to fit; returns the length written. */
size_t shim_escape_line(const char *s, char *out, size_t n);

#endif
