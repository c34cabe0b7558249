/* Report-time names for native return addresses: object, symbol, and
 * file:line where debug information exists. See symbolize.c. */
#ifndef SHIM_SYMBOLIZE_H
#define SHIM_SYMBOLIZE_H

#include <stdint.h>

typedef struct shim_symbol {
    const char *function;   /* NULL when no symbol covers the address; C++
                               names demangled */
    const char *raw;        /* the symbol as the object spells it (mangled),
                               when `function` is its demangled form; else NULL */
    const char *object;     /* path of the mapped object, NULL if unknown */
    uintptr_t offset;       /* address - object's load base */
    const char *file;       /* NULL without debug information */
    int line;               /* 0 without debug information */
} shim_symbol;

typedef struct shim_symbolizer shim_symbolizer;

/* NULL only when out of host memory. Strings returned by shim_symbolize stay
 * valid until shim_symbolizer_destroy. */
shim_symbolizer *shim_symbolizer_create(void);
/* `addr` is a return address (as captured); each address is resolved once
 * per symbolizer. */
void shim_symbolize(shim_symbolizer *s, uintptr_t addr, shim_symbol *out);
void shim_symbolizer_destroy(shim_symbolizer *s);

#endif
