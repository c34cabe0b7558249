/* The one safe-open policy for files the shim writes and reads. See path.c. */
#ifndef SHIM_PATH_H
#define SHIM_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* Expands `%p` to the pid and `%%` to `%` into out[n]. -1 (errno ENAMETOOLONG)
 * when it does not fit. */
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
/* How shim_path_open_write_fd opens. */
enum {
    SHIM_PATH_LOCK = 1,  /* an exclusive flock(2), taken before any truncation
                            and held while the descriptor stays open: EBUSY
                            (nothing truncated) when another process holds it */
    SHIM_PATH_KEEP = 2,  /* an existing file is not truncated (and is opened
                            for reading too, to be looked at) */
    SHIM_PATH_NEW = 4,   /* only a file created now (EEXIST otherwise) */
};
/* The same policy, a descriptor (close-on-exec, the offset at 0) rather
 * than a stream. -1 with errno set. */
int shim_path_open_write_fd(const char *path, unsigned how);
/* The file that is still at `path` with identity (dev, ino), opened again
 * for appending and locked (SHIM_PATH_LOCK): for a writer whose
 * descriptor the program closed. -1 with errno set (ESTALE: another file
 * is at the path; EBUSY: another process holds its lock). */
int shim_path_reopen_append(const char *path, dev_t dev, ino_t ino);
/* Reads a whole regular file of at most `max` bytes: a malloc'ed,
 * NUL-terminated copy (caller frees), its length in *len. Never blocks on a
 * FIFO and never reads a device. NULL with errno set (EISDIR, EINVAL for a
 * FIFO or device, EFBIG above `max`, or open's error). */
char *shim_path_read(const char *path, size_t max, size_t *len);
/* Why a path was refused, for a warning: the policy's errors in words,
 * strerror otherwise. */
const char *shim_path_why(int err);

#endif
