/* The public snapshot API (shim/snapshot.c) over the device layer, and the
 * leak hooks' capture: marks, live allocations since a mark, stacks. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_runtime.h"
#include "leak.h"
#include "options.h"
#include "stack.h"
#include "symbolize.h"

#define KB ((size_t)1 << 10)

static void leak_on(void)
{
    setenv("SPYRESHIM_LEAK_CHECK", "1", 1);
    shim_options_reload();
    shim_leak_init();
}

TestSuite(snapshot, .init = leak_on);

__attribute__((noinline)) void *allocate_from_here(shim_device *d, size_t size)
{
    void *p = NULL;
    cr_assert_eq(shim_device_malloc(d, &p, size), 0);
    __asm__ volatile("" ::: "memory");
    return p;
}

Test(snapshot, lists_live_allocations_since_a_mark)
{
    shim_device *d = fake_device(64 << 20);
    void *before = allocate_from_here(d, 3 * KB);
    spyreshim_mark m = spyreshim_mark_now();
    void *a = allocate_from_here(d, 5 * KB);
    void *b = allocate_from_here(d, 7 * KB);
    cr_assert_eq(shim_device_free(d, a), 0);

    spyreshim_snapshot *all = spyreshim_snapshot_take(0);
    cr_assert_eq(spyreshim_snapshot_count(all), 2);
    cr_assert_eq(spyreshim_snapshot_bytes(all), 10 * KB);
    spyreshim_snapshot_free(all);

    spyreshim_snapshot *s = spyreshim_snapshot_take(m);
    cr_assert_eq(spyreshim_snapshot_count(s), 1, "only b is new and live");
    const spyreshim_alloc_info *i = spyreshim_snapshot_get(s, 0);
    cr_assert_eq(i->ptr, (uintptr_t)b);
    cr_assert_eq(i->size, 7 * KB);
    cr_assert_gt(i->seq, m);
    cr_assert_str_eq(i->runtime, "fake");
    cr_assert_null(spyreshim_snapshot_get(s, 1));
    cr_assert_neq(i->native_stack, 0, "leak checking records a native stack");

    /* The stack's first frame is the caller of the device layer. */
    const uintptr_t *f;
    cr_assert_geq(shim_stack_frames(i->native_stack, &f), 2);
    shim_symbolizer *sym = shim_symbolizer_create();
    bool found = false;
    for (size_t k = 0; k < 4 && !found; k++) {
        shim_symbol y;
        shim_symbolize(sym, f[k], &y);
        found = y.function && strcmp(y.function, "allocate_from_here") == 0;
    }
    shim_symbolizer_destroy(sym);
    cr_assert(found, "allocate_from_here is among the innermost frames");
    spyreshim_snapshot_free(s);
    cr_assert_eq(shim_device_free(d, b), 0);
    cr_assert_eq(shim_device_free(d, before), 0);
}

/* Another thread allocates before a mark and after it, between them
 * waiting for the main thread: what it allocates after the mark is in the
 * mark's snapshot and what it allocated before is not (a thread hands out
 * sequence numbers from a batch it took earlier: the mark must end it). */
struct two_phase {
    shim_device *d;
    sem_t go, done;
    void *before[3], *after;
};

static void wait_bounded(sem_t *s)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += 30;
    int rc;
    while ((rc = sem_timedwait(s, &t)) != 0 && errno == EINTR)
        ;
    cr_assert_eq(rc, 0, "the other thread did not answer");
}

static void *two_phase_thread(void *arg)
{
    struct two_phase *tp = arg;
    for (int i = 0; i < 3; i++)
        tp->before[i] = allocate_from_here(tp->d, KB);
    sem_post(&tp->done);
    wait_bounded(&tp->go);
    tp->after = allocate_from_here(tp->d, 2 * KB);
    sem_post(&tp->done);
    return NULL;
}

Test(snapshot, a_mark_covers_what_other_threads_allocate_after_it)
{
    struct two_phase tp = {.d = fake_device(64 << 20)};
    sem_init(&tp.go, 0, 0);
    sem_init(&tp.done, 0, 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, two_phase_thread, &tp), 0);
    wait_bounded(&tp.done);
    spyreshim_mark m = spyreshim_mark_now();
    sem_post(&tp.go);
    wait_bounded(&tp.done);
    pthread_join(t, NULL);

    spyreshim_snapshot *s = spyreshim_snapshot_take(m);
    cr_assert_eq(spyreshim_snapshot_count(s), 1, "%zu blocks since the mark",
                 spyreshim_snapshot_count(s));
    cr_assert_eq(spyreshim_snapshot_get(s, 0)->ptr, (uintptr_t)tp.after);
    cr_assert_gt(spyreshim_snapshot_get(s, 0)->seq, m);
    spyreshim_snapshot_free(s);
    spyreshim_snapshot *all = spyreshim_snapshot_take(0);
    cr_assert_eq(spyreshim_snapshot_count(all), 4);
    spyreshim_snapshot_free(all);
}

Test(snapshot, print_and_json)
{
    shim_device *d = fake_device(64 << 20);
    void *p = allocate_from_here(d, 9 * KB);
    spyreshim_snapshot *s = spyreshim_snapshot_take(0);
    FILE *t = tmpfile();
    cr_assert_eq(spyreshim_snapshot_print(s, fileno(t), 0), 0);
    char buf[8192] = {0};
    cr_assert_gt(pread(fileno(t), buf, sizeof buf - 1, 0), 0);
    fclose(t);
    cr_assert(strstr(buf, "Live: 9216 B (9.0 KiB) in 1 allocation(s) of fake memory"), "%s", buf);
    cr_assert(strstr(buf, "allocate_from_here"), "%s", buf);

    char dir[] = "/tmp/snapjson-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/snap.%%p.json", dir);
    cr_assert_eq(spyreshim_snapshot_write_json(s, path), 0);
    char real[128];
    snprintf(real, sizeof real, "%s/snap.%ld.json", dir, (long)getpid());
    struct stat st;
    cr_assert_eq(stat(real, &st), 0, "%%p expands to the pid");
    cr_assert_eq(st.st_mode & 0777, 0600);
    FILE *j = fopen(real, "r");
    size_t n = fread(buf, 1, sizeof buf - 1, j);
    buf[n] = 0;
    fclose(j);
    cr_assert(strstr(buf, "\"reason\": \"snapshot\""), "%s", buf);
    cr_assert(strstr(buf, "\"function\": \"allocate_from_here\""), "%s", buf);
    unlink(real);
    rmdir(dir);
    cr_assert_eq(spyreshim_snapshot_write_json(s, NULL), -1);
    spyreshim_snapshot_free(s);
    cr_assert_eq(shim_device_free(d, p), 0);
}

Test(snapshot, empty_when_nothing_is_live)
{
    spyreshim_snapshot *s = spyreshim_snapshot_take(0);
    cr_assert_not_null(s);
    cr_assert_eq(spyreshim_snapshot_count(s), 0);
    cr_assert_eq(spyreshim_snapshot_bytes(s), 0);
    FILE *t = tmpfile();
    cr_assert_eq(spyreshim_snapshot_print(s, fileno(t), 0), 0);
    char buf[1024] = {0};
    cr_assert_gt(pread(fileno(t), buf, sizeof buf - 1, 0), 0);
    fclose(t);
    cr_assert(strstr(buf, "SUMMARY: spyreshim: 0 B live in 0 allocation(s)."), "%s", buf);
    cr_assert_eq(spyreshim_snapshot_print(s, -1, 0), -1, "a bad descriptor is an error");
    spyreshim_snapshot_free(s);
    cr_assert_eq(spyreshim_snapshot_count(NULL), 0);
}
