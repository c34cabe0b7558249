/* The one safe-open policy for every file the shim writes (SPYRESHIM_REPORT,
 * SPYRESHIM_STATS, snapshot JSON: whole files, written under a temporary
 * name and renamed over the path, so that a reader never sees half of one
 * and two writers never mix; the trace: appended to, under a lock) or
 * reads (SPYRESHIM_SUPPRESSIONS).
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
#include <time.h>
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

/* What is at `path` now may be replaced by us: nothing, or a regular file
 * of ours with one link. Never opened (a FIFO must not hang us), never
 * followed (lstat). */
static int replaceable(const char *path, struct stat *st)
{
    if (lstat(path, st) != 0)
        return errno == ENOENT ? 0 : errno;
    if (S_ISLNK(st->st_mode))
        return ELOOP;
    if (S_ISDIR(st->st_mode))
        return EISDIR;
    if (!S_ISREG(st->st_mode))
        return EINVAL;
    if (st->st_uid != geteuid() || st->st_nlink != 1)
        return EPERM;
    return 0;
}

FILE *shim_path_whole_open(struct shim_path_whole *w, const char *path)
{
    memset(w, 0, sizeof *w);
    struct stat st;
    int err = replaceable(path, &st);
    if (!err && (size_t)snprintf(w->tmp, sizeof w->tmp, "%s.spyreshim-XXXXXX", path) >=
                    sizeof w->tmp)
        err = ENAMETOOLONG;
    if (err) {
        errno = err;
        return NULL;
    }
    snprintf(w->path, sizeof w->path, "%s", path);
    /* O_EXCL, a name of its own: two writers never share a file. */
    int fd = mkostemp(w->tmp, O_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (fchmod(fd, 0600) != 0 || !(w->f = fdopen(fd, "w"))) {
        err = errno;
        close(fd);
        unlink(w->tmp);
        errno = err;
        return NULL;
    }
    return w->f;
}

int shim_path_whole_close(struct shim_path_whole *w, bool complete)
{
    int err = 0;
    if (ferror(w->f))
        err = errno ? errno : EIO;
    if (fclose(w->f) != 0 && !err)
        err = errno;
    w->f = NULL;
    struct stat st = {0};
    if (!complete && !err)
        err = ECANCELED;
    if (!err)
        err = replaceable(w->path, &st);
    if (!err && st.st_nlink) {
        /* Written since this process started: another process's (two
         * runs given one path); an older file is a run before. */
        uint64_t mtime = (uint64_t)st.st_mtim.tv_sec * 1000000000u + (uint64_t)st.st_mtim.tv_nsec;
        uint64_t started = shim_path_process_start_ns();
        w->replaced_newer = started && mtime >= started;
    }
    if (!err && rename(w->tmp, w->path) != 0)
        err = errno;
    if (err) {
        unlink(w->tmp);
        errno = err;
        return -1;
    }
    return 0;
}

/* Locked (LOCK_EX, never waiting): EBUSY when another process holds it. */
static int lock_now(int fd)
{
    if (flock(fd, LOCK_EX | LOCK_NB) == 0)
        return 0;
    return errno == EWOULDBLOCK ? EBUSY : errno;
}

int shim_path_open_write_fd(const char *path, unsigned how)
{
    /* Kept files are read too: the caller looks at what is there. */
    int access = (how & SHIM_PATH_KEEP) ? O_RDWR : O_WRONLY;
    int flags = access | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, flags | O_CREAT | O_EXCL, 0600);
    if (fd >= 0 && (how & SHIM_PATH_LOCK)) {
        /* Created by us an instant ago and locked by another already: it
         * found our new file and is writing it. */
        int err = lock_now(fd);
        if (err) {
            close(fd);
            errno = err;
            return -1;
        }
    }
    if (fd < 0 && errno == EEXIST && !(how & SHIM_PATH_NEW)) {
        /* O_NONBLOCK: a FIFO planted at the path must not hang us. */
        fd = open(path, flags | O_NONBLOCK);
        if (fd < 0)
            return -1;                   /* ELOOP for a symlink */
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
        else if ((how & SHIM_PATH_LOCK) && (err = lock_now(fd)) != 0)
            ;
        else if ((!(how & SHIM_PATH_KEEP) && ftruncate(fd, 0) != 0) || fchmod(fd, 0600) != 0)
            err = errno;
        else if (fcntl(fd, F_SETFL, access) != 0)   /* back to blocking */
            err = errno;
        if (err) {
            close(fd);
            errno = err;
            return -1;
        }
    }
    return fd;
}

int shim_path_reopen_append(const char *path, dev_t dev, ino_t ino)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -1;
    struct stat st;
    int err = 0;
    if (fstat(fd, &st) != 0)
        err = errno;
    else if (st.st_dev != dev || st.st_ino != ino)
        err = ESTALE;    /* another file is at the path now: not ours to write */
    else if ((err = lock_now(fd)) != 0)
        ;
    else if (fcntl(fd, F_SETFL, O_WRONLY | O_APPEND) != 0)
        err = errno;
    if (err) {
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* Where this process started, in CLOCK_REALTIME ns (0 when /proc says
 * nothing): its age from /proc/self/stat (clock ticks since boot) taken
 * from now. Here because files are judged by it: what a file holds was
 * written by this process's lifetime (an exec'd image is the same process)
 * or by another's. */
uint64_t shim_path_process_start_ns(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* After the command's name (which may hold spaces and parentheses),
     * field 3 on; the start time is field 22. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    for (int field = 3; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec boot, real;
    if (!p || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0 ||
        clock_gettime(CLOCK_REALTIME, &real) != 0)
        return 0;
    unsigned long long ticks = strtoull(p + 1, NULL, 10);
    uint64_t age = (uint64_t)boot.tv_sec * 1000000000u + (uint64_t)boot.tv_nsec -
                   (uint64_t)(ticks * (1000000000ull / (unsigned long long)hz));
    return (uint64_t)real.tv_sec * 1000000000u + (uint64_t)real.tv_nsec - age;
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
    case ESTALE: return "another file is at the path now";
    default: return strerror(err);
    }
}
