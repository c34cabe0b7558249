/* Diagnostics on stderr, one line each, prefixed "spyreshim: ".
 * Uses write(2) only: safe from any thread, with any lock held, and before
 * stdio or the interpreter are set up. */
#ifndef SHIM_LOG_H
#define SHIM_LOG_H

#include <stddef.h>

#include "options.h" /* enum shim_log_level: the value of SPYRESHIM_LOG */

/* Formats into a stack buffer then one write(); never allocates. */
void shim_log(enum shim_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Whether messages of `level` are printed. */
int shim_log_enabled(enum shim_log_level level);

#define shim_debug(...) shim_log(SHIM_LOG_DEBUG, __VA_ARGS__)
#define shim_info(...)  shim_log(SHIM_LOG_INFO, __VA_ARGS__)
#define shim_warn(...)  shim_log(SHIM_LOG_WARN, __VA_ARGS__)

#endif
