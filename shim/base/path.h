/* The one safe-open policy for files the shim writes and reads. See path.c. */
#ifndef SHIM_PATH_H
#define SHIM_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Expands `%p` (pid), `%r` (rank), `%l` (local rank), `%R` (restart count),
 * `%h` (host) and `%%` into out[n]; a ranked process's template without
 * `%r` gets `.rank<N>` before its first dot (path.c says where and why).
 * -1 (errno ENAMETOOLONG) when it does not fit. */
int shim_path_expand(const char *tmpl, char *out, size_t n);
/* Whether the template has a `%p` escape, by the same parser (`%%p` is a
 * literal `%p`, not the pid). */
bool shim_path_has_pid(const char *tmpl);
/* Opens `path` for writing a report: never follows a symlink at the last
 * component, creates it with mode 0600, and replaces an existing file only
 * when it is a regular file owned by the effective user (then truncated and
 * set to 0600). NULL with errno set (ELOOP for a symlink, EPERM for a file of
 * another user, EINVAL for a non-regular file). */
FILE *shim_path_open_write(const char *path);
/* The same, and with `lock` an exclusive flock(2) on the file, taken before
 * it is truncated and held while it stays open: EBUSY (nothing truncated)
 * when another process holds it. */
FILE *shim_path_open_write_locked(const char *path, bool lock);
/* Reads a whole regular file of at most `max` bytes: a malloc'ed,
 * NUL-terminated copy (caller frees), its length in *len. Never blocks on a
 * FIFO and never reads a device. NULL with errno set (EISDIR, EINVAL for a
 * FIFO or device, EFBIG above `max`, or open's error). */
char *shim_path_read(const char *path, size_t max, size_t *len);
/* Why a path was refused, for a warning: the policy's errors in words,
 * strerror otherwise. */
const char *shim_path_why(int err);

#endif
