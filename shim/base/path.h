/* The one safe-open policy for files the shim writes and reads. See path.c. */
#ifndef SHIM_PATH_H
#define SHIM_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* Expands `%p` (pid), `%r` (rank), `%l` (local rank), `%R` (restart count),
 * `%h` (host) and `%%` into out[n]; a ranked process's template without
 * `%r` gets `.rank<N>` before its first dot (path.c says where and why).
 * -1 (errno ENAMETOOLONG) when it does not fit. */
int shim_path_expand(const char *tmpl, char *out, size_t n);
/* Whether the template has a `%p` escape, by the same parser (`%%p` is a
 * literal `%p`, not the pid). */
bool shim_path_has_pid(const char *tmpl);
/* A whole file (a report, the statistics, a snapshot) being written. */
struct shim_path_whole {
    FILE *f;
    char path[4096];
    char tmp[4096 + 24];
    bool replaced_newer;  /* after close: the file it replaced was written
                             since this process started (another process's) */
};
/* Starts a whole file for `path`: refused, nothing created, when what is
 * there now may not be replaced (ELOOP a symlink, EISDIR, EINVAL a FIFO or
 * device, EPERM another user's file or one with other links); else a
 * stream on a new file next to it (mode 0600). NULL with errno set. */
FILE *shim_path_whole_open(struct shim_path_whole *w, const char *path);
/* Closes the stream and, when `complete` and every write went well, puts
 * the file at its path at once (rename); else removes it. -1 with errno
 * set (ECANCELED when not complete). */
int shim_path_whole_close(struct shim_path_whole *w, bool complete);
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
/* When this process started (an exec'd image: when the first did), in
 * CLOCK_REALTIME nanoseconds; 0 when /proc cannot say. */
uint64_t shim_path_process_start_ns(void);
/* Reads a whole regular file of at most `max` bytes: a malloc'ed,
 * NUL-terminated copy (caller frees), its length in *len. Never blocks on a
 * FIFO and never reads a device. NULL with errno set (EISDIR, EINVAL for a
 * FIFO or device, EFBIG above `max`, or open's error). */
char *shim_path_read(const char *path, size_t max, size_t *len);
/* Why a path was refused, for a warning: the policy's errors in words,
 * strerror otherwise. */
const char *shim_path_why(int err);

#endif
