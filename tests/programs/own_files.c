/* A program that does to its descriptors, working directory and image what
 * daemons, sandbox launchers and servers do, for tests/integration/
 * test_own_files.py (issue 47), run without and with the shim: what it
 * prints and the files it writes must be the same both ways. Each argument
 * is one operation:
 *   a:N:SIZE     allocate N simdev buffers of SIZE bytes, kept
 *   sleep:MS     sleep (past the trace writer's flush)
 *   wait:PATH    wait until PATH exists (60 s at most)
 *   closefds     close descriptors 3..1023, as close-fds code does
 *   open:PATH[:N]  open PATH for writing (created, truncated): "the file";
 *                N times (the numbers a program holding many files gets);
 *                prints the descriptor numbers it got
 *   write:TEXT   write TEXT and a newline to the file
 *   close        close the file (every descriptor open: gave)
 *   chdir:DIR    chdir(DIR)
 *   mv:FROM:TO   rename FROM to TO
 *   listen:PATH  listen on a Unix socket at PATH; prints its descriptor
 *   serve:N      accept N clients on it, answering each line "echo LINE"
 *   exec         execv this program with the arguments after this one
 *   touch:PATH   create PATH (empty)
 *   query        print SIGTERM's disposition as sigaction reads it (the
 *                handler, the flags, the mask, whether a restorer is set)
 *   term:HOW     set SIGTERM's disposition: `exit7` (a handler that
 *                prints and _exit(7)s, by sigaction), `signal` (the same
 *                by signal(), printing what it returned), `once` (an
 *                SA_SIGINFO | SA_RESETHAND handler that prints the signal
 *                and its disposition as seen inside, and returns), `dfl`,
 *                `ign`
 *   sigwait      block SIGTERM, print "waiting", take it with sigwait, print
 *                what it got (the program's own handling: no handler runs)
 *   fork         fork: the child goes on with the operations after this one;
 *                the parent prints "forked PID", waits for it, prints how
 *                it ended and exits 0
 *   threadwait   SIGTERM blocked in this thread; another thread prints
 *                "waiting" and waits for it (sigsuspend); this one joins it
 *   waitsig      print "waiting", wait for a signal (SIGTERM blocked before
 *                the line, sigsuspend), print "woke"
 * Prints one line per operation and exits 0, or 1 with a line when an
 * operation fails. */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simdev.h"

static int fail(const char *what)
{
    printf("%s failed: %s\n", what, strerror(errno));
    return 1;
}

static const char *kind(void (*h)(int));

static void say(const char *s)
{
    ssize_t r = write(1, s, strlen(s));
    (void)r;
}

static void on_term_exit7(int sig)
{
    say(sig == SIGTERM ? "handler: SIGTERM, exiting 7\n" : "handler: another signal\n");
    _exit(7);
}

static void query(const char *where);

static void on_term_once(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    char line[96];
    snprintf(line, sizeof line, "once: signal %d, si_signo %d\n", sig, si->si_signo);
    say(line);
    query("inside");
}

/* threadwait's thread: SIGTERM is delivered here, the only thread that
 * does not block it. */
static void *wait_thread(void *arg)
{
    (void)arg;
    sigset_t none;
    sigemptyset(&none);
    printf("waiting\n");
    sigsuspend(&none);
    printf("woke\n");
    return NULL;
}

static const char *kind(void (*h)(int))
{
    return h == SIG_DFL ? "SIG_DFL" : h == SIG_IGN ? "SIG_IGN" : h == SIG_ERR ? "SIG_ERR"
         : h == on_term_exit7 ? "exit7" : (void *)h == (void *)on_term_once ? "once"
         : "another handler";
}

static void query(const char *where)
{
    struct sigaction sa;
    char line[200];
    if (sigaction(SIGTERM, NULL, &sa) != 0) {
        snprintf(line, sizeof line, "%s: sigaction failed: %s\n", where, strerror(errno));
    } else {
        int masked = 0;
        for (int s = 1; s < 32; s++)
            masked += sigismember(&sa.sa_mask, s) ? 1 << (s % 31) : 0;
        snprintf(line, sizeof line, "%s: SIGTERM %s flags %#x mask %#x restorer %s\n", where,
                 kind(sa.sa_handler), (unsigned)sa.sa_flags, (unsigned)masked,
                 sa.sa_restorer ? "set" : "none");
    }
    say(line);
}

int main(int argc, char **argv)
{
    int file = -1, last = -1, nfiles = 0, lsock = -1;
    size_t kept = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        if (!strncmp(op, "a:", 2)) {
            char *end;
            unsigned long n = strtoul(op + 2, &end, 10);
            size_t size = strtoull(end + 1, NULL, 10);
            for (unsigned long k = 0; k < n; k++) {
                void *p;
                if (simdevMalloc(&p, size) != 0)
                    return fail("simdevMalloc");
                kept++;
            }
            printf("allocated %lu, %zu kept\n", n, kept);
        } else if (!strncmp(op, "sleep:", 6)) {
            long ms = atol(op + 6);
            struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        } else if (!strncmp(op, "wait:", 5)) {
            struct timespec ts = {0, 10000000L};
            for (int k = 0; k < 6000 && access(op + 5, F_OK) != 0; k++)
                nanosleep(&ts, NULL);
            printf("waited\n");
        } else if (!strcmp(op, "closefds")) {
            for (int fd = 3; fd < 1024; fd++)
                close(fd);
            printf("closed 3..1023\n");
        } else if (!strncmp(op, "open:", 5)) {
            char path[4096];
            snprintf(path, sizeof path, "%s", op + 5);
            char *colon = strrchr(path, ':');
            nfiles = 1;
            if (colon) {
                *colon = '\0';
                nfiles = atoi(colon + 1);
            }
            for (int k = 0; k < nfiles; k++) {
                int fd = open(path, O_WRONLY | O_CREAT | (k ? 0 : O_TRUNC), 0644);
                if (fd < 0)
                    return fail("open");
                if (k == 0)
                    file = fd;
                last = fd;
            }
            printf("opened fd %d..%d\n", file, last);
        } else if (!strncmp(op, "write:", 6)) {
            size_t n = strlen(op + 6);
            if (write(file, op + 6, n) != (ssize_t)n || write(file, "\n", 1) != 1)
                return fail("write");
            printf("wrote %zu bytes\n", n + 1);
        } else if (!strcmp(op, "close")) {
            for (int fd = file; fd <= last; fd++)
                if (close(fd) != 0)
                    return fail("close");
            file = -1;
            printf("closed the file\n");
        } else if (!strncmp(op, "chdir:", 6)) {
            if (chdir(op + 6) != 0)
                return fail("chdir");
            printf("in %s\n", op + 6);
        } else if (!strncmp(op, "mv:", 3)) {
            char from[4096];
            snprintf(from, sizeof from, "%s", op + 3);
            char *to = strchr(from, ':');
            if (!to)
                return fail("mv");
            *to++ = '\0';
            if (rename(from, to) != 0)
                return fail("rename");
            printf("moved\n");
        } else if (!strncmp(op, "listen:", 7)) {
            struct sockaddr_un a = {.sun_family = AF_UNIX};
            snprintf(a.sun_path, sizeof a.sun_path, "%s", op + 7);
            lsock = socket(AF_UNIX, SOCK_STREAM, 0);
            if (lsock < 0 || bind(lsock, (struct sockaddr *)&a, sizeof a) != 0 ||
                listen(lsock, 8) != 0)
                return fail("listen");
            printf("listening on fd %d\n", lsock);
        } else if (!strncmp(op, "serve:", 6)) {
            int n = atoi(op + 6);
            for (int k = 0; k < n; k++) {
                int c = accept(lsock, NULL, NULL);
                if (c < 0)
                    return fail("accept");
                char line[256];
                ssize_t r = read(c, line, sizeof line - 1);
                if (r < 0)
                    return fail("read");
                line[r] = '\0';
                line[strcspn(line, "\n")] = '\0';
                char out[300];
                int len = snprintf(out, sizeof out, "echo %s\n", line);
                if (write(c, out, (size_t)len) != len)
                    return fail("write to a client");
                close(c);
                printf("served %s\n", line);
            }
        } else if (!strncmp(op, "touch:", 6)) {
            int fd = open(op + 6, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
            if (fd < 0)
                return fail("touch");
            close(fd);
        } else if (!strcmp(op, "query")) {
            query("query");
        } else if (!strncmp(op, "term:", 5)) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sigemptyset(&sa.sa_mask);
            const char *how = op + 5;
            if (!strcmp(how, "signal")) {
                printf("signal() returned %s\n", kind(signal(SIGTERM, on_term_exit7)));
                continue;
            }
            if (!strcmp(how, "exit7")) {
                sa.sa_handler = on_term_exit7;
                sigaddset(&sa.sa_mask, SIGINT);
            } else if (!strcmp(how, "once")) {
                sa.sa_sigaction = on_term_once;
                sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
            } else if (!strcmp(how, "dfl")) {
                sa.sa_handler = SIG_DFL;
            } else if (!strcmp(how, "ign")) {
                sa.sa_handler = SIG_IGN;
            } else {
                printf("unknown term:%s\n", how);
                return 1;
            }
            struct sigaction old;
            if (sigaction(SIGTERM, &sa, &old) != 0)
                return fail("sigaction");
            printf("set %s, was %s\n", how, kind(old.sa_handler));
        } else if (!strcmp(op, "fork")) {
            pid_t pid = fork();
            if (pid < 0)
                return fail("fork");
            if (pid == 0)
                continue;
            printf("forked %d\n", (int)pid);
            int st;
            if (waitpid(pid, &st, 0) != pid)
                return fail("waitpid");
            if (WIFSIGNALED(st))
                printf("child ended by signal %d\n", WTERMSIG(st));
            else
                printf("child exited %d\n", WEXITSTATUS(st));
            return 0;
        } else if (!strcmp(op, "threadwait")) {
            sigset_t term;
            sigemptyset(&term);
            sigaddset(&term, SIGTERM);
            pthread_sigmask(SIG_BLOCK, &term, NULL);
            pthread_t t;
            if (pthread_create(&t, NULL, wait_thread, NULL) != 0)
                return fail("pthread_create");
            pthread_join(t, NULL);
        } else if (!strcmp(op, "sigwait")) {
            sigset_t term;
            sigemptyset(&term);
            sigaddset(&term, SIGTERM);
            sigprocmask(SIG_BLOCK, &term, NULL);
            printf("waiting\n");
            int got = 0;
            if (sigwait(&term, &got) != 0)
                return fail("sigwait");
            printf("sigwait got %d\n", got);
        } else if (!strcmp(op, "waitsig")) {
            /* Blocked before the line, taken in sigsuspend: a signal sent
             * when the line is read is never missed (pause's race). */
            sigset_t term, old;
            sigemptyset(&term);
            sigaddset(&term, SIGTERM);
            sigprocmask(SIG_BLOCK, &term, &old);
            printf("waiting\n");
            sigsuspend(&old);
            sigprocmask(SIG_SETMASK, &old, NULL);
            printf("woke\n");
        } else if (!strcmp(op, "exec")) {
            argv[i] = argv[0];
            execv("/proc/self/exe", argv + i);
            return fail("execv");
        } else {
            printf("unknown operation %s\n", op);
            return 1;
        }
    }
    return 0;
}
