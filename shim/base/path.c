/* The one safe-open policy for every file the shim writes (SPYRESHIM_REPORT,
 * SPYRESHIM_STATS, snapshot JSON) or reads (SPYRESHIM_SUPPRESSIONS).
 *
 * Owns no state. Both directions: regular files only; a FIFO or a device is
 * opened O_NONBLOCK (so opening it cannot block) and refused after fstat on
 * the opened descriptor, never read or written. Reads are bounded by a size
 * cap (/dev/zero, or a huge file by mistake, must not grow memory without
 * bound). Writes: the last path component is never followed when
 * it is a symlink (O_NOFOLLOW), a new file is created with O_EXCL and mode
 * 0600 whatever the umask says, and an existing file is reused only when it
 * is a regular file owned by our effective uid with a single link; another
 * user's file (think /tmp/report.json planted in advance) is never opened
 * for writing, let alone truncated. Truncation happens after the checks, on
 * the descriptor that was checked, so there is no window between check and
 * use.
 */
#include "path.h"
#include "rank.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* The one parser of a path template's escapes, for every caller (the
 * parent, each forked child, every report path): `%p` is the pid, `%r` the
 * rank, `%l` the local rank, `%R` the restart count, `%h` the host name
 * (rank.c; a value no launcher set expands to nothing), `%%` a literal `%`,
 * anything else itself. Scans left to right, so `%%p` is a literal `%`
 * followed by `p`, never the pid.
 *
 * In a process a launcher gave a rank, a template without `%r` gets
 * `.rank<N>` (and `.restart<N>` after a restart, without `%R`) before the
 * first dot of its file name, or at its end: two ranks, or two restarts,
 * never write one file, and every name says its rank (`out.json` becomes
 * `out.rank3.json`, its `.oom` companion `out.rank3.json.oom`). Writes into
 * out[n] when out is not NULL; returns the number of `%p` escapes, or -1
 * (ENAMETOOLONG). */
static const char *escape_value(char c, const char *pid)
{
    const shim_rank *id = shim_rank_get();
    const char *v;
    switch (c) {
    case 'p': return pid;
    case 'r': v = id->rank; break;
    case 'l': v = id->local_rank; break;
    case 'R': v = id->restart; break;
    case 'h': v = id->host; break;
    case '%': return "%";
    default: return NULL;
    }
    return v ? v : "";
}

static int expand(const char *tmpl, char *out, size_t n)
{
    const shim_rank *id = shim_rank_get();
    char pid[24];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    /* Where the launcher's identity goes when the template does not say. */
    bool has_rank = false, has_restart = false;
    const char *base = tmpl, *dot = NULL;
    for (const char *p = tmpl; *p; p++) {
        if (p[0] == '%' && p[1] && escape_value(p[1], pid)) {
            has_rank |= p[1] == 'r';
            has_restart |= p[1] == 'R';
            p++;
        } else if (*p == '/') {
            base = p + 1;
            dot = NULL;
        } else if (*p == '.' && !dot && p != base) {
            dot = p;
        }
    }
    char extra[160] = "";
    if (id->rank && !has_rank)
        snprintf(extra, sizeof extra, ".rank%s", id->rank);
    if (id->rank && id->restart && strcmp(id->restart, "0") != 0 && !has_restart)
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), ".restart%s", id->restart);
    const char *at = dot ? dot : tmpl + strlen(tmpl);

    size_t o = 0;
    int pids = 0;
    for (const char *p = tmpl;; p++) {
        const char *ins[2] = {NULL, NULL};
        char one[2] = {*p, 0};
        if (p == at && extra[0])
            ins[0] = extra;
        if (!*p) {
            ins[1] = "";
        } else if (p[0] == '%' && p[1] && escape_value(p[1], pid)) {
            ins[1] = escape_value(p[1], pid);
            pids += p[1] == 'p';
            p++;
        } else {
            ins[1] = one;
        }
        for (int k = 0; k < 2; k++) {
            size_t l = ins[k] ? strlen(ins[k]) : 0;
            if (out && l) {
                if (o + l >= n) {
                    errno = ENAMETOOLONG;
                    return -1;
                }
                memcpy(out + o, ins[k], l);
            }
            o += l;
        }
        if (!*p)
            break;
    }
    if (out) {
        if (o >= n) {
            errno = ENAMETOOLONG;
            return -1;
        }
        out[o] = '\0';
    }
    return pids;
}

int shim_path_expand(const char *tmpl, char *out, size_t n)
{
    return expand(tmpl, out, n) < 0 ? -1 : 0;
}

bool shim_path_has_pid(const char *tmpl)
{
    return expand(tmpl, NULL, 0) > 0;
}

FILE *shim_path_open_write(const char *path)
{
    return shim_path_open_write_locked(path, false);
}

FILE *shim_path_open_write_locked(const char *path, bool lock)
{
    int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, flags | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 && lock && flock(fd, LOCK_EX | LOCK_NB) != 0) {
        /* Created by us an instant ago and locked by another already: it
         * found our new file and is writing it. */
        int err = errno == EWOULDBLOCK ? EBUSY : errno;
        close(fd);
        errno = err;
        return NULL;
    }
    if (fd < 0 && errno == EEXIST) {
        /* O_NONBLOCK: a FIFO planted at the path must not hang us. */
        fd = open(path, flags | O_NONBLOCK);
        if (fd < 0)
            return NULL;                 /* ELOOP for a symlink */
        struct stat st;
        int err = 0;
        if (fstat(fd, &st) != 0)
            err = errno;
        else if (!S_ISREG(st.st_mode))
            err = EINVAL;
        else if (st.st_uid != geteuid() || st.st_nlink != 1)
            err = EPERM;
        /* Locked before truncating: a file another process is writing is
         * left whole (flock, on the open file: a forked child shares the
         * parent's lock, another process never does). */
        else if (lock && flock(fd, LOCK_EX | LOCK_NB) != 0)
            err = errno == EWOULDBLOCK ? EBUSY : errno;
        else if (ftruncate(fd, 0) != 0 || fchmod(fd, 0600) != 0)
            err = errno;
        else if (fcntl(fd, F_SETFL, O_WRONLY) != 0)   /* back to blocking */
            err = errno;
        if (err) {
            close(fd);
            errno = err;
            return NULL;
        }
    }
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        int err = errno;
        close(fd);
        errno = err;
    }
    return f;
}

char *shim_path_read(const char *path, size_t max, size_t *len)
{
    /* O_NONBLOCK: opening a FIFO with no writer would otherwise block. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return NULL;
    struct stat st;
    int err = 0;
    if (fstat(fd, &st) != 0)
        err = errno;
    else if (S_ISDIR(st.st_mode))
        err = EISDIR;
    else if (!S_ISREG(st.st_mode))
        err = EINVAL;
    else if ((uint64_t)st.st_size > max)
        err = EFBIG;
    char *buf = NULL;
    size_t n = 0;
    if (!err) {
        /* A regular file can still grow under us, and /proc files say size
         * 0: read at most max + 1 bytes to tell "too large" apart. */
        size_t cap = (size_t)st.st_size < 4096 ? 4096 : (size_t)st.st_size + 1;
        if (cap > max + 1)
            cap = max + 1;
        buf = malloc(cap + 1);
        if (!buf)
            err = ENOMEM;
        while (!err) {
            if (n == cap) {
                if (n > max) {
                    err = EFBIG;
                    break;
                }
                size_t ncap = cap * 2 > max + 1 ? max + 1 : cap * 2;
                char *nb = realloc(buf, ncap + 1);
                if (!nb) {
                    err = ENOMEM;
                    break;
                }
                buf = nb;
                cap = ncap;
            }
            ssize_t r = read(fd, buf + n, cap - n);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                err = errno;
            else if (r == 0)
                break;
            else
                n += (size_t)r;
        }
        if (!err && n > max)
            err = EFBIG;
    }
    close(fd);
    if (err) {
        free(buf);
        errno = err;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

const char *shim_path_why(int err)
{
    switch (err) {
    case ELOOP: return "it is a symbolic link";
    case EPERM: return "it belongs to another user or has other links";
    case EINVAL:
    case ENXIO: return "not a regular file (a FIFO or a device)";
    case EISDIR: return "it is a directory";
    case EFBIG: return "too large";
    case EBUSY: return "another process is writing it (it holds the file's lock)";
    default: return strerror(err);
    }
}
