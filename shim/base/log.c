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

#include "escape.h"
#include "log.h"
#include "options.h"

int shim_log_enabled(enum shim_log_level level)
{
    return (int)level >= shim_opts()->log_level && level != SHIM_LOG_OFF;
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
    n += shim_escape_line(msg, buf + n, sizeof buf - n - 1);
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
