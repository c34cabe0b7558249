/* Files the shim writes (shim/base/path.c): never follow symlinks, 0600, never
 * overwrite another user's file, never hang on a FIFO. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "path.h"

static char dir[64];

static void mkdir_tmp(void)
{
    strcpy(dir, "/tmp/path-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_tmp(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(path, .init = mkdir_tmp, .fini = rm_tmp);

static void slurp(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = '\0';
    fclose(f);
}

Test(path, expands_pid_and_percent)
{
    char out[64], want[64];
    cr_assert_eq(shim_path_expand("/t/r.%p.json", out, sizeof out), 0);
    snprintf(want, sizeof want, "/t/r.%ld.json", (long)getpid());
    cr_assert_str_eq(out, want);
    cr_assert_eq(shim_path_expand("100%%-%x", out, sizeof out), 0);
    cr_assert_str_eq(out, "100%-%x");
    cr_assert_eq(shim_path_expand("0123456789", out, 10), -1);
    cr_assert_eq(errno, ENAMETOOLONG);
}

static struct shim_path_whole whole;

static FILE *shim_path_open_write(const char *path)
{
    return shim_path_whole_open(&whole, path);
}

static void close_whole(void)
{
    cr_assert_eq(shim_path_whole_close(&whole, true), 0, "%s", strerror(errno));
}

Test(path, new_file_is_0600_whatever_the_umask)
{
    char path[128];
    snprintf(path, sizeof path, "%s/new.json", dir);
    mode_t old = umask(0);
    FILE *f = shim_path_open_write(path);
    umask(old);
    cr_assert_not_null(f);
    fputs("{}", f);
    close_whole();
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0600, "mode %o", st.st_mode & 07777);
}

Test(path, own_file_is_replaced)
{
    char path[128], buf[64];
    snprintf(path, sizeof path, "%s/own.json", dir);
    FILE *f = fopen(path, "w");
    fputs("old contents, longer than the new ones", f);
    fclose(f);
    chmod(path, 0644);
    f = shim_path_open_write(path);
    cr_assert_not_null(f);
    fputs("new", f);
    fflush(f);
    slurp(path, buf, sizeof buf);
    cr_assert_str_eq(buf, "old contents, longer than the new ones", "replaced at once, not before");
    close_whole();
    slurp(path, buf, sizeof buf);
    cr_assert_str_eq(buf, "new");
    struct stat st;
    stat(path, &st);
    cr_assert_eq(st.st_mode & 07777, 0600);
}

Test(path, symlink_is_not_followed)
{
    char path[128], target[128], buf[64];
    snprintf(target, sizeof target, "%s/target", dir);
    snprintf(path, sizeof path, "%s/link.json", dir);
    FILE *f = fopen(target, "w");
    fputs("precious", f);
    fclose(f);
    cr_assert_eq(symlink(target, path), 0);
    errno = 0;
    cr_assert_null(shim_path_open_write(path));
    cr_assert_eq(errno, ELOOP);
    slurp(target, buf, sizeof buf);
    cr_assert_str_eq(buf, "precious");
    /* A dangling link must not create its target either. */
    char dangling[128], nowhere[128];
    snprintf(dangling, sizeof dangling, "%s/dangling.json", dir);
    snprintf(nowhere, sizeof nowhere, "%s/nowhere", dir);
    cr_assert_eq(symlink(nowhere, dangling), 0);
    cr_assert_null(shim_path_open_write(dangling));
    cr_assert_neq(access(nowhere, F_OK), 0);
}

Test(path, another_users_file_is_never_overwritten)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to give a file to another user");
    char path[128], buf[64];
    snprintf(path, sizeof path, "%s/theirs.json", dir);
    FILE *f = fopen(path, "w");
    fputs("theirs", f);
    fclose(f);
    cr_assert_eq(chown(path, 65534, 65534), 0);
    errno = 0;
    cr_assert_null(shim_path_open_write(path));
    cr_assert_eq(errno, EPERM);
    slurp(path, buf, sizeof buf);
    cr_assert_str_eq(buf, "theirs");
}

Test(path, fifo_is_refused_without_hanging)
{
    char path[128];
    snprintf(path, sizeof path, "%s/fifo", dir);
    cr_assert_eq(mkfifo(path, 0600), 0);
    cr_assert_null(shim_path_open_write(path));
}

Test(path, hard_link_is_refused)
{
    char path[128], other[128];
    snprintf(other, sizeof other, "%s/other", dir);
    snprintf(path, sizeof path, "%s/hard.json", dir);
    FILE *f = fopen(other, "w");
    fclose(f);
    cr_assert_eq(link(other, path), 0);
    cr_assert_null(shim_path_open_write(path));
    cr_assert_eq(errno, EPERM);
}

/* One parser: `%%p` is a literal `%p`, never the pid (a forked child used
 * to find "%p" in "x%%p" and reopen, truncating, the parent's trace). */
Test(path, escaped_percent_p_is_not_the_pid)
{
    char out[64];
    cr_assert_eq(shim_path_expand("x%%p.trace", out, sizeof out), 0);
    cr_assert_str_eq(out, "x%p.trace");
    cr_assert_not(shim_path_has_pid("x%%p.trace"));
    cr_assert_not(shim_path_has_pid("x%%%%p"));
    cr_assert(shim_path_has_pid("x%%%p"));
    cr_assert(shim_path_has_pid("t-%p"));
    cr_assert_not(shim_path_has_pid("t-%"));
}

/* A whole file that was not completed leaves the old one and no
 * temporary file behind. */
Test(path, an_incomplete_whole_file_leaves_the_old_one)
{
    char path[128], buf[64];
    snprintf(path, sizeof path, "%s/kept.json", dir);
    FILE *f = fopen(path, "w");
    fputs("old", f);
    fclose(f);
    f = shim_path_open_write(path);
    cr_assert_not_null(f);
    fputs("half", f);
    errno = 0;
    cr_assert_eq(shim_path_whole_close(&whole, false), -1);
    cr_assert_eq(errno, ECANCELED);
    slurp(path, buf, sizeof buf);
    cr_assert_str_eq(buf, "old");
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(n, 1, "a temporary file was left");
}

/* A file locked by another writer is refused (EBUSY) and left whole: the
 * lock is taken before the truncation. */
Test(path, locked_file_is_left_whole)
{
    char path[128], buf[16];
    snprintf(path, sizeof path, "%s/t.trace", dir);
    int a = shim_path_open_write_fd(path, SHIM_PATH_LOCK);
    cr_assert_geq(a, 0);
    cr_assert_eq(write(a, "first", 5), 5);
    pid_t pid = fork();
    if (pid == 0) {
        /* Another process: the lock is on the open file, a fork shares
         * it, so a separate open is what another process does. */
        int b = shim_path_open_write_fd(path, SHIM_PATH_LOCK);
        _exit(b < 0 && errno == EBUSY ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the second writer must get EBUSY");
    slurp(path, buf, sizeof buf);
    cr_assert_str_eq(buf, "first");
    close(a);
    int c = shim_path_open_write_fd(path, SHIM_PATH_LOCK);
    cr_assert_geq(c, 0, "free again once the first writer closed it");
    close(c);
}
