/* The threaded promises of issue 7, one scenario per run (the integration
 * test tests/integration/test_promises.py runs each a few times under a
 * generous timeout, the hang detector; bench/promises_stress.sh runs them
 * by the thousand with the CPUs busy). Run preloaded with libspyreshim.so.
 *   promises loader LIB   thread B dlopen()s LIB, whose constructor
 *                         allocates, while main makes its first allocation
 *   promises foreign 1|2  thread W holds lock L while thread O's pressure
 *                         callback needs L; W allocates under pressure and
 *                         must get out-of-memory, not wait forever
 *                         (1: W takes L before O's event, 2: after)
 *   promises unregister N N rounds: unregister a callback while another
 *                         thread's event runs it, then poison its `user`;
 *                         the callback must never see the poison
 *   promises fork N       N forks while two threads allocate under
 *                         pressure; each child allocates, frees, exits
 *   promises fork-in-event one fork while thread O's pressure event runs;
 *                         the child allocates under pressure, runs its own
 *                         event and gets its block (no wait, no OOM)
 *   promises fork-publish one fork while thread P, making the process's
 *                         first call into the runtime, holds the hook
 *                         resolution lock (held there by the shim's test
 *                         hook); the child allocates, frees, exits
 * Prints one line "<scenario> ok ..." and exits 0, or says what broke and
 * exits 1. Sizes assume SPYRESHIM_LIMIT=8M (loader: any).
 * PROMISES_HANG_WAIT=S (debugging only): a fork child that hangs is named
 * on stderr ("promises: child PID hangs") and left alone for S seconds
 * before it is killed, so that a debugger can be attached to it. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "simdev.h"
#include "spyreshim.h"

#define MB (1u << 20)

__attribute__((visibility("default"))) _Atomic int promises_in_ctor;

/* The shim's API, looked up in the preloaded library (not linked). */
static int (*reg)(spyreshim_pressure_fn, void *);
static int (*unreg)(spyreshim_pressure_fn, void *);
static void (*lock_release)(spyreshim_lock *);
static void (*lock_acquire)(spyreshim_lock *);
static int (*get_stats)(spyreshim_stats *);

static void need_shim(void)
{
    *(void **)&reg = dlsym(RTLD_DEFAULT, "spyreshim_register_pressure_callback");
    *(void **)&unreg = dlsym(RTLD_DEFAULT, "spyreshim_unregister_pressure_callback");
    *(void **)&lock_release = dlsym(RTLD_DEFAULT, "spyreshim_lock_release");
    *(void **)&lock_acquire = dlsym(RTLD_DEFAULT, "spyreshim_lock_acquire");
    *(void **)&get_stats = dlsym(RTLD_DEFAULT, "spyreshim_get_stats");
    if (!reg || !unreg || !lock_release || !lock_acquire || !get_stats) {
        fprintf(stderr, "promises: fork-publish needs the test build of the shim: "
                        "LD_PRELOAD=libspyreshim_testhooks.so\n");
        exit(2);
    }
}

static void pause_us(long us)
{
    struct timespec p = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&p, NULL);
}

/* ---- loader ------------------------------------------------------------- */

static void *open_lib(void *path)
{
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

static int loader(const char *lib)
{
    pthread_t b;
    pthread_create(&b, NULL, open_lib, (void *)lib);
    /* Start the first allocation while B's constructor holds the loader's
     * lock (bounded wait for it to get there). */
    for (int i = 0; i < 20000 && !atomic_load(&promises_in_ctor); i++)
        pause_us(50);
    void *p = NULL;
    int rc = simdevMalloc(&p, MB);
    if (rc == 0)
        simdevFree(p);
    void *h = NULL;
    pthread_join(b, &h);
    int *ctor_rc = h ? dlsym(h, "ctor_alloc_result") : NULL;
    if (rc != 0 || !h || !ctor_rc || *ctor_rc != 0) {
        printf("loader FAILED main=%d dlopen=%s ctor=%d\n", rc, h ? "ok" : dlerror(),
               ctor_rc ? *ctor_rc : -1);
        return 1;
    }
    printf("loader ok\n");
    return 0;
}

/* ---- foreign lock ------------------------------------------------------- */

static pthread_mutex_t L = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int in_cb, w_holds_l;
static int order;

static void needs_l(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want;
    (void)user;
    lock_release(lock);
    atomic_store(&in_cb, 1);
    if (order == 2)
        while (!atomic_load(&w_holds_l))
            pause_us(100);
    pthread_mutex_lock(&L);
    pthread_mutex_unlock(&L);
    lock_acquire(lock);
}

static void *other(void *arg)
{
    (void)arg;
    void *p = NULL;
    if (simdevMalloc(&p, 16 * MB) == 0)  /* above the limit: a pressure event */
        simdevFree(p);
    return NULL;
}

static int foreign(int which)
{
    need_shim();
    order = which;
    reg(needs_l, NULL);
    if (order == 1) {
        pthread_mutex_lock(&L);
        atomic_store(&w_holds_l, 1);
    }
    pthread_t o;
    pthread_create(&o, NULL, other, NULL);
    while (!atomic_load(&in_cb))
        pause_us(100);
    if (order == 2) {
        pthread_mutex_lock(&L);
        atomic_store(&w_holds_l, 1);
    }
    /* O's event is running and needs L, which we hold: waiting for that
     * event must end, with out-of-memory for this request. */
    void *p = NULL;
    int rc = simdevMalloc(&p, 16 * MB);
    pthread_mutex_unlock(&L);
    pthread_join(o, NULL);
    spyreshim_stats s = {.size = sizeof s};
    get_stats(&s);
    if (rc != simdevErrorMemoryAllocation || s.pressure_wait_timeouts == 0) {
        printf("foreign %d FAILED rc=%d pressure_wait_timeouts=%llu\n", order, rc,
               (unsigned long long)s.pressure_wait_timeouts);
        return 1;
    }
    printf("foreign %d ok rc=%d pressure_wait_timeouts=%llu\n", order, rc,
           (unsigned long long)s.pressure_wait_timeouts);
    return 0;
}

/* ---- unregister --------------------------------------------------------- */

#define ALIVE 0x600dcafe
#define POISON 0xdeadbeef

struct user {
    _Atomic unsigned magic;
};

static _Atomic int entered, stop;
static _Atomic unsigned long saw_poison, runs;

static void checks_user(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want;
    lock_release(lock);
    struct user *u = user;
    atomic_store(&entered, 1);
    atomic_fetch_add(&runs, 1);
    for (int i = 0; i < 20; i++) {
        if (atomic_load(&u->magic) != ALIVE)
            atomic_fetch_add(&saw_poison, 1);
        pause_us(20);
    }
    lock_acquire(lock);
}

static void *pressure_loop(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop)) {
        void *p = NULL;
        if (simdevMalloc(&p, 16 * MB) == 0)
            simdevFree(p);
    }
    return NULL;
}

static int unregister_race(int rounds)
{
    need_shim();
    struct user **users = calloc((size_t)rounds, sizeof *users);
    pthread_t o;
    pthread_create(&o, NULL, pressure_loop, NULL);
    int raced = 0;
    for (int i = 0; i < rounds; i++) {
        struct user *u = users[i] = malloc(sizeof *u);
        atomic_store(&u->magic, ALIVE);
        atomic_store(&entered, 0);
        reg(checks_user, u);
        for (int k = 0; k < 20000 && !atomic_load(&entered); k++)
            pause_us(25);
        raced += atomic_load(&entered);
        if (unreg(checks_user, u) != 0) {
            printf("unregister FAILED: not registered\n");
            return 1;
        }
        /* The promise: the callback no longer runs anywhere. Poison rather
         * than free, so that a broken promise shows without ASan. */
        atomic_store(&u->magic, POISON);
    }
    atomic_store(&stop, 1);
    pthread_join(o, NULL);
    for (int i = 0; i < rounds; i++)
        free(users[i]);
    free(users);
    unsigned long bad = atomic_load(&saw_poison);
    printf("unregister %s rounds=%d raced=%d runs=%lu saw_poison=%lu\n", bad ? "FAILED" : "ok",
           rounds, raced, atomic_load(&runs), bad);
    return bad ? 1 : 0;
}

/* ---- fork --------------------------------------------------------------- */

/* Churn threads that made their first request: forks start after that.
 * A fork during the runtime's own first call (its pthread_once) is the
 * fork-publish scenario's; here it would only add ThreadSanitizer's
 * pthread_once, which does not survive such a fork, to what is tested. */
static _Atomic int churning;

static void *churn(void *arg)
{
    (void)arg;
    void *held[8] = {0};
    unsigned seed = (unsigned)(uintptr_t)&held;
    int first = 1;
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 8; i++) {
            if (held[i]) {
                simdevFree(held[i]);
                held[i] = NULL;
            }
            if (simdevMalloc(&held[i], (1 + rand_r(&seed) % 2) * MB) != 0)
                held[i] = NULL;  /* out of memory after a pressure event: go on */
            if (first) {
                first = 0;
                atomic_fetch_add(&churning, 1);
            }
        }
    }
    for (int i = 0; i < 8; i++)
        if (held[i])
            simdevFree(held[i]);
    return NULL;
}

/* Hang detector per child: generous, never a timing assertion. */
static void wait_child(pid_t pid, int *hangs, int *bad)
{
    int status = 0;
    pid_t w = 0;
    for (int k = 0; k < 200000 && (w = waitpid(pid, &status, WNOHANG)) == 0; k++)
        pause_us(100);
    if (w == 0) {
        (*hangs)++;
        const char *wait_s = getenv("PROMISES_HANG_WAIT");
        if (wait_s && atoi(wait_s) > 0) {
            fprintf(stderr, "promises: child %d hangs; waiting %s s for a debugger\n",
                    (int)pid, wait_s);
            sleep((unsigned)atoi(wait_s));
        }
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        (*bad)++;
    }
}

static int child_allocates(void)
{
    void *p = NULL;
    int rc = simdevMalloc(&p, MB);
    if (rc == 0)
        rc = simdevFree(p);
    /* Out of memory is an answer too (the parent's threads held the limit
     * at fork); what must not happen is no answer. */
    return rc == 0 || rc == simdevErrorMemoryAllocation ? 0 : 3;
}

static int forks(int n)
{
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, churn, NULL);
    while (atomic_load(&churning) < 2)
        pause_us(100);
    int hangs = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(child_allocates());
        if (pid < 0) {
            bad++;
            continue;
        }
        wait_child(pid, &hangs, &bad);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    printf("fork %s forks=%d hangs=%d failed=%d\n", hangs || bad ? "FAILED" : "ok", n, hangs, bad);
    return hangs || bad ? 1 : 0;
}

/* ---- fork during another thread's pressure event ------------------------ */

/* Main fills the device with blocks the callback can free, then thread O's
 * request starts a pressure event whose callback holds on (bounded) until
 * main has forked. The child, where O's event is not running, allocates
 * under pressure: it must run its own event (its copy of the callback
 * frees its copy of the blocks) and get its block, not wait for the
 * parent's event and then fail with out-of-memory. */
static void *cache[64];
static int ncache;
static pid_t parent_pid;
static _Atomic int o_in_event, forked;
static int child_runs;

static void frees_cache(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want;
    (void)user;
    lock_release(lock);
    if (getpid() == parent_pid) {
        atomic_store(&o_in_event, 1);
        for (int k = 0; k < 200000 && !atomic_load(&forked); k++)
            pause_us(50);
    } else {
        child_runs++;
    }
    for (int i = 0; i < ncache; i++)
        simdevFree(cache[i]);
    ncache = 0;
    lock_acquire(lock);
}

static void *one_more(void *arg)
{
    void *p = NULL;
    *(int *)arg = simdevMalloc(&p, MB);
    if (*(int *)arg == 0)
        simdevFree(p);
    return NULL;
}

static int child_under_pressure(void)
{
    spyreshim_stats before = {.size = sizeof before}, after = {.size = sizeof after};
    get_stats(&before);
    void *p = NULL;
    int rc = simdevMalloc(&p, MB);
    get_stats(&after);
    unsigned long long waits = after.pressure_waits - before.pressure_waits;
    printf("fork-in-event child rc=%d own_callback_runs=%d waits_for_parent_event=%llu\n", rc,
           child_runs, waits);
    fflush(stdout);
    return rc == 0 && child_runs == 1 && waits == 0 ? 0 : 4;
}

static int fork_in_event(void)
{
    need_shim();
    parent_pid = getpid();
    /* No callback yet: the request that does not fit fails at once. */
    while (ncache < 64 && simdevMalloc(&cache[ncache], MB) == 0)
        ncache++;
    reg(frees_cache, NULL);
    int o_rc = -1;
    pthread_t o;
    pthread_create(&o, NULL, one_more, &o_rc);
    for (int k = 0; k < 200000 && !atomic_load(&o_in_event); k++)
        pause_us(50);
    if (!atomic_load(&o_in_event)) {
        printf("fork-in-event FAILED: no pressure event (filled %d blocks)\n", ncache);
        return 1;
    }
    int hangs = 0, bad = 0;
    pid_t pid = fork();
    if (pid == 0)
        _exit(child_under_pressure());
    atomic_store(&forked, 1);
    if (pid < 0)
        bad++;
    else
        wait_child(pid, &hangs, &bad);
    pthread_join(o, NULL);
    int ok = !hangs && !bad && o_rc == 0;
    printf("fork-in-event %s hangs=%d failed=%d parent_rc=%d\n", ok ? "ok" : "FAILED", hangs, bad,
           o_rc);
    return ok ? 0 : 1;
}

/* ---- fork while a thread publishes the runtime -------------------------- */

static void (*_Atomic *test_publishing)(void);
static _Atomic int publishing, fork_preparing, fork_done;

static void note_prepare(void) { atomic_store(&fork_preparing, 1); }
static void note_parent(void) { atomic_store(&fork_done, 1); }

/* Called by the shim with the hook resolution lock held. Holds it until
 * main's fork is under way, then until that fork is done (a fork policy
 * that leaves the lock out forks under us, and the child inherits it held)
 * or for 200 ms (a policy that takes it waits for us: it cannot finish
 * while we are here). Bounded either way. */
static void hold_publication(void)
{
    atomic_store(&publishing, 1);
    for (int k = 0; k < 100000 && !atomic_load(&fork_preparing); k++)
        pause_us(50);
    for (int k = 0; k < 4000 && !atomic_load(&fork_done); k++)
        pause_us(50);
}

static void *first_call(void *arg)
{
    (void)arg;
    void *p = NULL;
    if (simdevMalloc(&p, MB) == 0)
        simdevFree(p);
    return NULL;
}

static int fork_publish(void)
{
    *(void **)&test_publishing = dlsym(RTLD_DEFAULT, "spyreshim_test_publishing");
    if (!test_publishing) {
        fprintf(stderr, "promises: fork-publish needs the test build of the shim: "
                        "LD_PRELOAD=libspyreshim_testhooks.so\n");
        return 2;
    }
    /* Registered after the shim's process-wide handlers: this prepare runs
     * before the shim's, this parent after the shim's. */
    pthread_atfork(note_prepare, note_parent, NULL);
    atomic_store(test_publishing, hold_publication);
    pthread_t p;
    pthread_create(&p, NULL, first_call, NULL);
    for (int k = 0; k < 100000 && !atomic_load(&publishing); k++)
        pause_us(50);
    if (!atomic_load(&publishing)) {
        printf("fork-publish FAILED: the first call never reached the publication\n");
        return 1;
    }
    int hangs = 0, bad = 0;
    pid_t pid = fork();
    if (pid == 0) {
        atomic_store(test_publishing, NULL);
        _exit(child_allocates());
    }
    if (pid < 0)
        bad++;
    else
        wait_child(pid, &hangs, &bad);
    pthread_join(p, NULL);
    printf("fork-publish %s hangs=%d failed=%d\n", hangs || bad ? "FAILED" : "ok", hangs, bad);
    return hangs || bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[1], "loader"))
        return loader(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "foreign"))
        return foreign(atoi(argv[2]) == 2 ? 2 : 1);
    if (argc >= 3 && !strcmp(argv[1], "unregister"))
        return unregister_race(atoi(argv[2]));
    if (argc >= 3 && !strcmp(argv[1], "fork"))
        return forks(atoi(argv[2]));
    if (argc >= 2 && !strcmp(argv[1], "fork-in-event"))
        return fork_in_event();
    if (argc >= 2 && !strcmp(argv[1], "fork-publish"))
        return fork_publish();
    fprintf(stderr, "usage: promises loader LIB | foreign 1|2 | unregister N | fork N | "
                    "fork-publish\n");
    return 2;
}
