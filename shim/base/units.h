/* Sizes as text, one way for every line the shim prints: see units.c. */
#ifndef SHIM_UNITS_H
#define SHIM_UNITS_H

#include <stdint.h>

/* "18446744073709551615 B (16.0 EiB)": the longest, with its NUL. */
#define SHIM_SIZE_TEXT 40

/* `268435456 B (256.0 MiB)`; `512 B` below 1 KiB. Writes into buf (at
 * least SHIM_SIZE_TEXT bytes) and returns it. */
const char *shim_size_text(char *buf, uint64_t bytes);

#endif
