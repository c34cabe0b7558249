/* Creation of report files (SPYRESHIM_REPORT, snapshot JSON).
 *
 * Owns no state. The rules: the last path component is never followed when
 * it is a symlink (O_NOFOLLOW), a new file is created with O_EXCL and mode
 * 0600 whatever the umask says, and an existing file is reused only when it
 * is a regular file owned by our effective uid with a single link; another
 * user's file (think /tmp/report.json planted in advance) is never opened
 * for writing, let alone truncated. Truncation happens after the checks, on
 * the descriptor that was checked, so there is no window between check and
 * use.
 */
#include "path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int shim_path_expand(const char *tmpl, char *out, size_t n)
{
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        char num[24];
        const char *ins = NULL;
        char one[2] = {*p, 0};
        if (p[0] == '%' && p[1] == 'p') {
            snprintf(num, sizeof num, "%ld", (long)getpid());
            ins = num;
            p++;
        } else if (p[0] == '%' && p[1] == '%') {
            ins = "%";
            p++;
        } else {
            ins = one;
        }
        size_t l = strlen(ins);
        if (o + l >= n) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(out + o, ins, l);
        o += l;
    }
    if (o >= n) {
        errno = ENAMETOOLONG;
        return -1;
    }
    out[o] = '\0';
    return 0;
}

FILE *shim_path_open_write(const char *path)
{
    int flags = O_WRONLY | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(path, flags | O_CREAT | O_EXCL, 0600);
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
