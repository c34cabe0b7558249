/* The shim's own descriptors: the trace file, the control socket, the
 * pipe Python frames are read through.
 *
 * Why: programs close descriptors they do not know (daemons, sandbox
 * launchers, close-fds loops over 3..1023) and then open their own, which
 * get the lowest free numbers. A descriptor of ours left at a low number
 * is then the program's file: writing a trace chunk into it corrupts the
 * program's data, accepting on it steals its clients (issue 47). So a
 * descriptor of ours is moved high (F_DUPFD_CLOEXEC: where a program
 * reaches only when it holds that many files), and its file's identity
 * (st_dev, st_ino) is recorded and checked before each use: a number that
 * no longer names our file is never used, whoever holds it now.
 *
 * Owns no state: the caller keeps its struct shim_ownfd under its own
 * lock. A check and the use after it are two system calls: a program that
 * closes and reopens in between is not seen; that window is the only one. */
#include "ownfd.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

/* The lowest number we move to: 1024 (above every close-fds loop bounded
 * by FD_SETSIZE) when the limit leaves room, else 64 below the limit. */
static int high_floor(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return 1024;
    if (rl.rlim_cur >= 1024 + 64)
        return 1024;
    return rl.rlim_cur > 64 + 3 ? (int)rl.rlim_cur - 64 : 3;
}

int shim_ownfd_take(struct shim_ownfd *o, int fd)
{
    int high = fcntl(fd, F_DUPFD_CLOEXEC, high_floor());
    if (high >= 0) {
        close(fd);
        fd = high;
    } else {
        /* No high number free: ours where it is, still checked before use. */
        (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        o->fd = -1;
        return -1;
    }
    o->fd = fd;
    o->dev = st.st_dev;
    o->ino = st.st_ino;
    return 0;
}

bool shim_ownfd_is_ours(const struct shim_ownfd *o)
{
    struct stat st;
    return o->fd >= 0 && fstat(o->fd, &st) == 0 && st.st_dev == o->dev && st.st_ino == o->ino;
}

void shim_ownfd_close(struct shim_ownfd *o)
{
    if (shim_ownfd_is_ours(o))
        close(o->fd);
    o->fd = -1;
}
