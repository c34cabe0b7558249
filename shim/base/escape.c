/* One line of text from any string: control characters escaped, so that a
 * value from the environment (a newline in a path) cannot split a
 * diagnostic in two. Used by log.c for every message and by options.c for
 * its warnings, which it prints without log.c (the options are what
 * log.c reads).
 *
 * Owns no state, takes no lock, never allocates: usable with any lock held
 * and from a fork child. */
#include "escape.h"

#include <string.h>

size_t shim_escape_line(const char *s, char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (n == 0)
        return 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char e[4];
        size_t l = 0;
        if (c == '\n') {
            e[l++] = '\\'; e[l++] = 'n';
        } else if (c == '\r') {
            e[l++] = '\\'; e[l++] = 'r';
        } else if (c == '\t') {
            e[l++] = '\\'; e[l++] = 't';
        } else if (c < 0x20 || c == 0x7f) {
            e[l++] = '\\'; e[l++] = 'x'; e[l++] = hex[c >> 4]; e[l++] = hex[c & 15];
        } else {
            e[l++] = (char)c;
        }
        if (o + l >= n)
            break;
        memcpy(out + o, e, l);
        o += l;
    }
    out[o] = '\0';
    return o;
}
