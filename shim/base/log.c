/* stderr diagnostics. Formats into a stack buffer and emits one write(2):
 * no stdio, no allocation, no lock, so it is usable with the allocator
 * lock held, from a fork child, and from the library's constructor. A
 * message is always one line: control characters in it (a newline in a
 * path from the environment) are escaped. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "options.h"

int shim_log_enabled(enum shim_log_level level)
{
    return (int)level >= shim_opts()->log_level && level != SHIM_LOG_OFF;
}

size_t shim_log_escape(const char *s, char *out, size_t n)
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

void shim_log(enum shim_log_level level, const char *fmt, ...)
{
    if (!shim_log_enabled(level))
        return;
    int saved = errno;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (k < 0)
        msg[0] = '\0';
    char buf[1024 + 64];
    static const char prefix[] = "spyreshim: ";
    memcpy(buf, prefix, sizeof prefix - 1);
    size_t n = sizeof prefix - 1;
    n += shim_log_escape(msg, buf + n, sizeof buf - n - 1);
    buf[n++] = '\n';
    for (size_t off = 0; off < n;) {
        ssize_t w = write(STDERR_FILENO, buf + off, n - off);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            break;
        }
        off += (size_t)w;
    }
    errno = saved;
}
