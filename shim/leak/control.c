/* The control socket (SPYRESHIM_CONTROL=1): `spyreshim snapshot PID` asks
 * a running process for its live allocations now.
 *
 * Why a socket and not a signal: a socket is opened only when the option
 * asks, so a program under the shim without it has nothing of ours to
 * collide with; a signal would have to be one the program never uses (no
 * number is safe in every program: runtimes, JVMs and profilers take
 * real-time ones), its default action kills a process that is not under
 * the shim, and it carries no answer. The socket is in the abstract
 * namespace, named "spyreshim-control.PID": it needs no file to clean up
 * (it goes with the process, and with exec: it is close-on-exec), and the
 * kernel gives both ends the other's credentials (SO_PEERCRED), so the
 * shim answers only its own user and the CLI checks that the listener is
 * the process it asked for.
 *
 * Owns: the listening socket and the control thread, which blocks every
 * signal and does all the work; no lock (the thread alone uses the
 * socket). The socket is a descriptor of the shim's own (shim/base/
 * ownfd.c): high, checked before each accept; a program that closed it
 * (and may listen on that number itself) never has a client of its
 * accepted here: the thread makes its socket again. A request is served
 * on that thread: the live records copied (shim_snapshot_take_timed: each
 * arena lock held for its copy only, the one moment allocating threads can
 * be stopped, and timed), Python frames still unresolved resolved with the
 * GIL (shim_pystack_resolve_detached: the moment Python threads are
 * stopped), then, with no lock held, the report built and written into
 * memory and sent.
 * The answer is one line ("ok ..." with the figures, or "error: ...")
 * followed, for a snapshot, by the JSON of docs/report-format.md.
 *
 * Must never: serve a request on a program thread or in a signal handler;
 * hold a lock of the shim while talking to the client; wait on a client
 * without a bound (receive 1 s, send 10 s); die on a bad request (one line
 * of error, then the next). A forked child closes the parent's socket
 * (shim/process/fork.c) and listens on none; an exec'd one opens its own.
 */
#include "control.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "collections.h"
#include "log.h"
#include "options.h"
#include "ownfd.h"
#include "pystack.h"
#include "report.h"
#include "snapshot.h"
#include "spyreshim.h"
#include "suppress.h"

#define REQUEST_MAX 64

/* The listening socket: the control thread's alone once it runs (and the
 * fork child's, to close it). */
static struct shim_ownfd g_listen = SHIM_OWNFD_NONE;

/* The abstract address of process `pid` ("\0spyreshim-control.PID"). */
static socklen_t control_address(int pid, struct sockaddr_un *a)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "spyreshim-control.%d", pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* A socket listening on this process's name, moved where programs do not
 * reuse numbers (shim/base/ownfd.c). -1 with errno set. */
static int listen_socket(struct shim_ownfd *o)
{
    /* Non-blocking: a client gone between poll() and accept() costs an
     * EAGAIN, never a wait. */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un a;
    socklen_t al = control_address((int)getpid(), &a);
    if (bind(fd, (struct sockaddr *)&a, al) != 0 || listen(fd, 4) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return shim_ownfd_take(o, fd);
}

/* Before each accept: the number still names our socket. A program that
 * closed it (close-fds code) may listen on that number now; accepting
 * there would take its clients. The number is left to it and our socket
 * made again (the old one, and its name, went with its last reference). */
static bool still_listening(void)
{
    if (shim_ownfd_is_ours(&g_listen))
        return true;
    int old = g_listen.fd;
    g_listen.fd = -1;   /* the program's now: never accepted on, never closed */
    if (listen_socket(&g_listen) != 0) {
        shim_warn("SPYRESHIM_CONTROL: the program closed the control socket (%d) and it cannot "
                  "be opened again (%s); `spyreshim snapshot %d` is no longer answered", old,
                  strerror(errno), (int)getpid());
        return false;
    }
    shim_debug("control: the program closed the control socket (%d); listening again on %d",
               old, g_listen.fd);
    return true;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void send_line(int fd, const char *line)
{
    (void)send_all(fd, line, strlen(line));
}

/* One line of at most REQUEST_MAX bytes, within the receive timeout.
 * Returns its length (without the newline), -1 when none came, -2 when
 * it is longer. */
static int read_request(int fd, char *buf)
{
    size_t n = 0;
    while (n < REQUEST_MAX) {
        ssize_t r = recv(fd, buf + n, REQUEST_MAX - n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        char *nl = memchr(buf + n, '\n', (size_t)r);
        n += (size_t)r;
        if (nl) {
            *nl = '\0';
            return (int)(nl - buf);
        }
    }
    return -2;
}

static void serve_snapshot(int fd)
{
    shim_live_timing t;
    spyreshim_snapshot *s = shim_snapshot_take_timed(0, &t);
    if (!s) {
        send_line(fd, "error: out of host memory\n");
        return;
    }
    uint64_t gil_ns = shim_pystack_resolve_detached();
    size_t n = spyreshim_snapshot_count(s);
    shim_report *r = shim_report_build(n ? spyreshim_snapshot_get(s, 0) : NULL, n,
                                       shim_suppressions_active());
    uint64_t bytes = spyreshim_snapshot_bytes(s);
    spyreshim_snapshot_free(s);
    char *json = NULL, *coll = NULL;
    size_t len = 0;
    FILE *f = r ? open_memstream(&json, &len) : NULL;
    int rc = -1;
    if (f) {
        coll = shim_collections_json();
        char *members = NULL;
        if (coll && asprintf(&members, "\"collections\": %s", coll) < 0)
            members = NULL;
        rc = shim_report_write_json_extra(r, f, "snapshot", members);
        free(members);
        if (fclose(f) != 0)
            rc = -1;
    }
    shim_report_free(r);
    free(coll);
    if (rc != 0) {
        free(json);
        send_line(fd, "error: out of host memory\n");
        return;
    }
    char head[200];
    snprintf(head, sizeof head,
             "ok spyreshim-snapshot 1 blocks=%zu bytes=%" PRIu64 " held_ns=%" PRIu64
             " longest_ns=%" PRIu64 " longest_cpu_ns=%" PRIu64 " gil_ns=%" PRIu64
             " length=%zu\n",
             n, bytes, t.held_ns, t.longest_ns, t.longest_cpu_ns, gil_ns, len);
    if (send_all(fd, head, strlen(head)) == 0)
        (void)send_all(fd, json, len);
    free(json);
    shim_debug("control: snapshot of %zu block(s): allocator locks %.3f ms (longest hold "
               "%.3f ms), GIL %.3f ms", n, t.held_ns / 1e6, t.longest_ns / 1e6, gil_ns / 1e6);
}

static void serve(int fd)
{
    struct timeval rcv = {1, 0}, snd = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof rcv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof snd);
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != geteuid()) {
        send_line(fd, "error: permission denied: only the process's own user may ask\n");
        return;
    }
    char req[REQUEST_MAX + 1];
    int n = read_request(fd, req);
    if (n == -2) {
        send_line(fd, "error: expected one request line (\"snapshot\") of at most 64 bytes\n");
        return;
    }
    if (n < 0) {
        send_line(fd, "error: expected one request line (\"snapshot\") within 1 s\n");
        return;
    }
    if (n > 0 && req[n - 1] == '\r')
        req[--n] = '\0';
    if (strcmp(req, "snapshot") == 0) {
        serve_snapshot(fd);
        return;
    }
    send_line(fd, "error: unknown request (expected \"snapshot\")\n");
}

/* How long the thread waits for a client before it looks again whether
 * the program closed its socket. */
#define IDLE_CHECK_MS 1000

static void *control_main(void *arg)
{
    (void)arg;
    while (still_listening()) {
        /* Waiting in poll(), never in accept(): a blocked accept holds the
         * lowest free descriptor number for the connection it will make,
         * and the program's next open() would get another number than
         * without the shim. */
        struct pollfd p = {.fd = g_listen.fd, .events = POLLIN};
        int ready = poll(&p, 1, IDLE_CHECK_MS);
        if (ready > 0 && !(p.revents & POLLIN)) {
            /* Closed under us (POLLNVAL: still_listening() decides), or an
             * error that would wake poll() at once again: never a busy loop. */
            struct timespec pause = {0, 100000000};
            nanosleep(&pause, NULL);
            continue;
        }
        if (ready <= 0 || !still_listening())
            continue;
        int c = accept4(g_listen.fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                struct timespec pause = {0, 100000000};
                nanosleep(&pause, NULL);
            }
            continue;   /* EAGAIN (the client left), EINTR, ECONNABORTED, ... */
        }
        /* Served up to 11 s (the timeouts): high, out of the program's way. */
        struct shim_ownfd conn;
        if (shim_ownfd_take(&conn, c) != 0)
            continue;
        serve(conn.fd);
        /* The answer first, then what the client sent beyond the request
         * (a bounded drain): closing with unread input would reset the
         * connection and could drop the answer's last line. */
        shutdown(conn.fd, SHUT_WR);
        char sink[4096];
        for (int k = 0; k < 16 && recv(conn.fd, sink, sizeof sink, 0) > 0; k++)
            ;
        shim_ownfd_close(&conn);
    }
    return NULL;
}

void shim_control_init(void)
{
    const shim_options *o = shim_opts();
    if (!o->control || g_listen.fd >= 0)
        return;
    if (o->secure) {
        shim_warn("SPYRESHIM_CONTROL is ignored in secure mode (AT_SECURE)");
        return;
    }
    if (listen_socket(&g_listen) != 0) {
        shim_warn("SPYRESHIM_CONTROL: cannot listen on spyreshim-control.%d: %s",
                  (int)getpid(), strerror(errno));
        return;
    }
    /* The thread blocks every signal: the program's handlers never run on
     * it, and a signal meant for the program is never taken by it. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &attr, control_main, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        shim_warn("SPYRESHIM_CONTROL: no control thread: %s", strerror(rc));
        shim_ownfd_close(&g_listen);
        return;
    }
    shim_debug("control: listening on @spyreshim-control.%d", (int)getpid());
}

void shim_control_atfork_child(void)
{
    /* The thread stayed in the parent; the socket is the parent's name. */
    shim_ownfd_close(&g_listen);
}
