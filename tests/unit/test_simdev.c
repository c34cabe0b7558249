/* The simulated device's contract (tests/simdev/simdev.h), tested directly
 * against libsimdev (no shim). Criterion runs every test in its own
 * process, so each test picks its capacity with SIMDEV_MEMORY before the
 * device's first use. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "simdev.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static void capacity(const char *v)
{
    setenv("SIMDEV_MEMORY", v, 1);
}

static void cap_1m(void) { capacity("1M"); }
static void cap_64m(void) { capacity("64M"); }
static void cap_64g(void) { capacity("64G"); }

static size_t free_bytes(void)
{
    size_t f = 0, t = 0;
    cr_assert_eq(simdevMemGetInfo(&f, &t), 0);
    return f;
}

Test(simdev, capacity_and_out_of_memory, .init = cap_1m)
{
    size_t f, t;
    cr_assert_eq(simdevMemGetInfo(&f, &t), 0);
    cr_assert_eq(t, MiB);
    cr_assert_eq(f, MiB);

    void *p = NULL, *q = NULL;
    cr_assert_eq(simdevMalloc(&p, MiB + 1), 2, "more than the capacity is out of memory");
    cr_assert_eq(simdevMalloc(&p, MiB), 0);
    cr_assert_not_null(p);
    cr_assert_eq(free_bytes(), 0);
    cr_assert_eq(simdevMalloc(&q, 1), 2, "a full device is out of memory");
    cr_assert_eq(simdevFree(p), 0);
    cr_assert_eq(free_bytes(), MiB);
    cr_assert_eq(simdevMalloc(&p, SIZE_MAX), 2, "a size that overflows rounding");
}

Test(simdev, sizes_round_to_256_and_blocks_are_aligned, .init = cap_1m)
{
    void *p[5];
    size_t sizes[5] = { 1, 255, 256, 257, 1000 };
    size_t used = 0;
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(simdevMalloc(&p[i], sizes[i]), 0);
        cr_assert_eq((uintptr_t)p[i] % 256, 0, "block %d at %p", i, p[i]);
        used += (sizes[i] + 255) / 256 * 256;
        cr_assert_eq(free_bytes(), MiB - used);
    }
    for (int i = 0; i < 5; i++)
        cr_assert_eq(simdevFree(p[i]), 0);
    cr_assert_eq(free_bytes(), MiB);
}

Test(simdev, size_zero_is_success_with_null, .init = cap_1m)
{
    void *p = (void *)0x1234;
    cr_assert_eq(simdevMalloc(&p, 0), 0);
    cr_assert_null(p);
    cr_assert_eq(free_bytes(), MiB);
    cr_assert_eq(simdevMalloc(NULL, 16), 1, "no place for the pointer is an invalid value");
}

Test(simdev, free_null_is_success, .init = cap_1m)
{
    cr_assert_eq(simdevFree(NULL), 0);
}

Test(simdev, bad_frees_are_invalid_and_change_nothing, .init = cap_1m)
{
    void *p, *q;
    cr_assert_eq(simdevMalloc(&p, 4096), 0);
    cr_assert_eq(simdevMalloc(&q, 4096), 0);
    cr_assert_eq(simdevFree((char *)p + 256), 1, "interior pointer");
    cr_assert_eq(simdevFree((char *)q + 4096 * 4), 1, "free space");
    int host;
    cr_assert_eq(simdevFree(&host), 1, "host pointer");
    cr_assert_eq(simdevFree((void *)8), 1, "wild pointer");
    cr_assert_eq(free_bytes(), MiB - 8192);
    cr_assert_eq(simdevFree(p), 0);
    cr_assert_eq(simdevFree(p), 1, "double free");
    cr_assert_eq(free_bytes(), MiB - 4096);
    cr_assert_eq(simdevFree(q), 0);
    cr_assert_eq(free_bytes(), MiB);
}

Test(simdev, memset_memcpy_round_trip, .init = cap_1m)
{
    enum { N = 3000 };
    unsigned char in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (unsigned char)(i * 7 + 3);
    void *a, *b;
    cr_assert_eq(simdevMalloc(&a, N), 0);
    cr_assert_eq(simdevMalloc(&b, N), 0);

    cr_assert_eq(simdevMemcpy(a, in, N, 1), 0);
    cr_assert_eq(simdevMemcpy(b, a, N, 3), 0);
    memset(out, 0, N);
    cr_assert_eq(simdevMemcpy(out, b, N, 2), 0);
    cr_assert_arr_eq(out, in, N);

    cr_assert_eq(simdevMemset((char *)b + 100, 0xab, 50), 0);
    cr_assert_eq(simdevMemcpy(out, b, N, 2), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(out[i], (i >= 100 && i < 150) ? 0xab : in[i], "byte %d", i);

    /* Interior ranges are fine as long as they stay inside the block. */
    cr_assert_eq(simdevMemcpy((char *)a + 10, (char *)a + 20, 100, 3), 0);
    cr_assert_eq(simdevMemcpy(out, (char *)a + 10, 100, 2), 0);
    cr_assert_arr_eq(out, in + 20, 100);
    cr_assert_eq(simdevFree(a), 0);
    cr_assert_eq(simdevFree(b), 0);
}

Test(simdev, bad_ranges_are_invalid_and_never_crash, .init = cap_1m)
{
    char host[2048];
    void *a, *b;
    cr_assert_eq(simdevMalloc(&a, 1000), 0);
    cr_assert_eq(simdevMalloc(&b, 1000), 0);

    cr_assert_eq(simdevMemcpy(a, host, 1001, 1), 1, "H2D overruns the requested size");
    cr_assert_eq(simdevMemcpy(host, a, 1001, 2), 1, "D2H overruns");
    cr_assert_eq(simdevMemcpy(b, a, 1001, 3), 1, "D2D overruns");
    cr_assert_eq(simdevMemcpy((char *)a + 999, host, 2, 1), 1, "interior start overruns");
    cr_assert_eq(simdevMemset(a, 0, 1001), 1, "memset overruns");
    cr_assert_eq(simdevMemset((char *)a + 1000, 0, 1), 1, "past the end");
    cr_assert_eq(simdevMemset(NULL, 0, 1), 1, "NULL device pointer");
    cr_assert_eq(simdevMemcpy(NULL, host, 1, 1), 1, "NULL device dst");
    cr_assert_eq(simdevMemcpy(a, NULL, 1, 1), 1, "NULL host src");
    cr_assert_eq(simdevMemcpy(NULL, a, 1, 2), 1, "NULL host dst");
    cr_assert_eq(simdevMemcpy(a, b, 1, 1), 1, "device pointer as host source");
    cr_assert_eq(simdevMemcpy(b, a, 1, 2), 1, "device pointer as host destination");
    cr_assert_eq(simdevMemcpy(host, host + 1024, 1, 3), 1, "host pointers as device");
    cr_assert_eq(simdevMemcpy(b, a, 1, 0), 1, "unknown kind");
    cr_assert_eq(simdevMemcpy(b, a, 1, 4), 1, "unknown kind");
    cr_assert_eq(simdevMemset(host, 0, 1), 1, "host pointer to memset");

    cr_assert_eq(simdevFree(b), 0);
    cr_assert_eq(simdevMemset(b, 0, 1), 1, "freed block");
    cr_assert_eq(simdevMemcpy(host, b, 1, 2), 1, "freed block");
    cr_assert_eq(simdevMemset(NULL, 0, 0), 0, "count 0 is success");
    cr_assert_eq(simdevMemcpy(NULL, NULL, 0, 1), 0, "count 0 is success");
    cr_assert_eq(simdevFree(a), 0);
}

Test(simdev, error_strings)
{
    cr_assert_str_eq(simdevGetErrorString(0), "no error");
    cr_assert_str_eq(simdevGetErrorString(1), "invalid argument");
    cr_assert_str_eq(simdevGetErrorString(2), "out of memory");
    cr_assert_str_eq(simdevGetErrorString(77), "unrecognized error code");
    cr_assert_str_eq(simdevGetErrorString(-1), "unrecognized error code");
}

Test(simdev, capacity_far_above_host_ram, .init = cap_64g)
{
    size_t f, t;
    cr_assert_eq(simdevMemGetInfo(&f, &t), 0);
    cr_assert_eq(t, 64 * GiB);
    void *p[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(simdevMalloc(&p[i], 16 * GiB), 0, "16G block %d", i);
    cr_assert_eq(free_bytes(), 0);
    void *q;
    cr_assert_eq(simdevMalloc(&q, 256), 2);

    /* Touch the two ends of the last block only. */
    char buf[4096], back[4096];
    memset(buf, 0x5a, sizeof buf);
    char *last = (char *)p[3] + 16 * GiB - sizeof buf;
    cr_assert_eq(simdevMemcpy(last, buf, sizeof buf, 1), 0);
    cr_assert_eq(simdevMemcpy(back, last, sizeof back, 2), 0);
    cr_assert_arr_eq(back, buf, sizeof buf);
    cr_assert_eq(simdevMemset(p[3], 1, 1 * MiB), 0);

    for (int i = 0; i < 4; i++)
        cr_assert_eq(simdevFree(p[i]), 0);
    cr_assert_eq(free_bytes(), 64 * GiB);
    cr_assert_eq(simdevMalloc(&q, 64 * GiB), 0, "the frees merged back into one extent");
    cr_assert_eq(simdevFree(q), 0);
}

static int died_of(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0)
        cr_assert_eq(errno, EINTR);
    return WIFSIGNALED(status) ? WTERMSIG(status) : -WEXITSTATUS(status);
}

Test(simdev, host_store_through_device_pointer_faults, .init = cap_1m)
{
    void *p;
    cr_assert_eq(simdevMalloc(&p, 4096), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        *(volatile char *)p = 1;
        _exit(0);
    }
    cr_assert_eq(died_of(pid), SIGSEGV, "a host store to device memory must fault");

    pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        char c = *(volatile char *)p;
        _exit(c == 0 ? 0 : 1);
    }
    cr_assert_eq(died_of(pid), SIGSEGV, "a host load from device memory must fault");
}

/* Runs `SIMDEV_MEMORY=value` in a child; returns the total it reports and
 * what it printed on stderr. */
static size_t total_in_child(const char *value, char *err, size_t errlen)
{
    int errp[2], outp[2];
    cr_assert_eq(pipe(errp), 0);
    cr_assert_eq(pipe(outp), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        dup2(errp[1], 2);
        setenv("SIMDEV_MEMORY", value, 1);
        size_t f = 0, t = 0;
        simdevMemGetInfo(&f, &t);
        if (write(outp[1], &t, sizeof t) != sizeof t)
            _exit(3);
        _exit(0);
    }
    close(errp[1]);
    close(outp[1]);
    size_t t = 0;
    cr_assert_eq(read(outp[0], &t, sizeof t), (ssize_t)sizeof t);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < errlen && (r = read(errp[0], err + n, errlen - 1 - n)) > 0)
        n += (size_t)r;
    err[n] = '\0';
    close(errp[0]);
    close(outp[0]);
    cr_assert_eq(died_of(pid), 0);
    return t;
}

Test(simdev, simdev_memory_accepts_binary_suffixes)
{
    struct { const char *v; size_t want; } ok[] = {
        { "1048576", MiB }, { "4K", 4 * KiB }, { "3M", 3 * MiB }, { "2G", 2 * GiB },
        { "16G", 16 * GiB }, { "1T", (size_t)1 << 40 }, { "512MiB", 512 * MiB }, { "8kb", 8 * KiB },
    };
    char err[512];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cr_assert_eq(total_in_child(ok[i].v, err, sizeof err), ok[i].want, "%s", ok[i].v);
        cr_assert_str_eq(err, "", "%s printed: %s", ok[i].v, err);
    }
}

Test(simdev, bad_simdev_memory_warns_once_and_uses_1g)
{
    const char *bad[] = { "lots", "12X", "-5", "0", "", "1G2", "99999999999999999999T" };
    char err[512];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(total_in_child(bad[i], err, sizeof err), GiB, "'%s'", bad[i]);
        cr_assert_not_null(strstr(err, "SIMDEV_MEMORY"), "'%s' printed: %s", bad[i], err);
        char *nl = strchr(err, '\n');
        cr_assert(nl && nl[1] == '\0', "'%s': one line expected, got: %s", bad[i], err);
    }
}

/* Randomized alloc/free against a reference model: blocks never overlap,
 * are aligned, and the free count is exact. */
Test(simdev, random_operations_match_a_model, .init = cap_64m)
{
    unsigned seed = (unsigned)time(NULL);
    const char *s = getenv("SIMDEV_TEST_SEED");
    if (s)
        seed = (unsigned)strtoul(s, NULL, 10);
    fprintf(stderr, "random_operations_match_a_model: seed %u (SIMDEV_TEST_SEED)\n", seed);
    srand(seed);

    enum { SLOTS = 2000 };
    static char *ptr[SLOTS];
    static size_t len[SLOTS];
    size_t used = 0;
    for (int step = 0; step < 40000; step++) {
        int i = rand() % SLOTS;
        if (ptr[i]) {
            cr_assert_eq(simdevFree(ptr[i]), 0, "seed %u", seed);
            used -= (len[i] + 255) / 256 * 256;
            ptr[i] = NULL;
        } else {
            size_t n = (size_t)1 << (rand() % 17);
            n += (size_t)rand() % n;
            void *p;
            int rc = simdevMalloc(&p, n);
            size_t need = (n + 255) / 256 * 256;
            if (rc == 2) {
                cr_assert_gt(used + need, 64 * MiB - 64 * MiB / 2,
                             "refused %zu with %zu used, seed %u", n, used, seed);
                continue;
            }
            cr_assert_eq(rc, 0, "seed %u", seed);
            cr_assert_eq((uintptr_t)p % 256, 0, "seed %u", seed);
            ptr[i] = p;
            len[i] = n;
            used += need;
        }
        if (step % 4000 == 0) {
            for (int a = 0; a < SLOTS; a++)
                for (int b = a + 1; b < SLOTS && ptr[a]; b++)
                    if (ptr[b])
                        cr_assert(ptr[a] + len[a] <= ptr[b] || ptr[b] + len[b] <= ptr[a],
                                  "blocks %d and %d overlap, seed %u", a, b, seed);
        }
        cr_assert_eq(free_bytes(), 64 * MiB - used, "seed %u", seed);
    }
    for (int i = 0; i < SLOTS; i++)
        if (ptr[i])
            cr_assert_eq(simdevFree(ptr[i]), 0);
    void *all;
    cr_assert_eq(simdevMalloc(&all, 64 * MiB), 0, "everything merged back, seed %u", seed);
}

/* Several threads allocate, fill with their own pattern, verify, free. */
static void *worker(void *arg)
{
    unsigned char tag = (unsigned char)(uintptr_t)arg;
    unsigned char buf[8192];
    unsigned r = tag;
    for (int i = 0; i < 2000; i++) {
        r = r * 1103515245u + 12345u;
        size_t n = 1 + (r >> 8) % sizeof buf;
        void *p;
        if (simdevMalloc(&p, n) != 0)
            return (void *)"malloc failed";
        if (simdevMemset(p, tag, n) != 0)
            return (void *)"memset failed";
        sched_yield();
        if (simdevMemcpy(buf, p, n, 2) != 0)
            return (void *)"memcpy failed";
        for (size_t k = 0; k < n; k++)
            if (buf[k] != tag)
                return (void *)"another thread's bytes in my block";
        if (simdevFree(p) != 0)
            return (void *)"free failed";
    }
    return NULL;
}

Test(simdev, threads_never_share_blocks, .init = cap_64m)
{
    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, worker, (void *)(i + 1)), 0);
    for (int i = 0; i < 8; i++) {
        void *res;
        pthread_join(t[i], &res);
        cr_assert_null(res, "thread %d: %s", i, (char *)res);
    }
    cr_assert_eq(free_bytes(), 64 * MiB);
}

Test(simdev, fork_child_gets_a_private_device, .init = cap_1m)
{
    void *p;
    unsigned char b[512];
    cr_assert_eq(simdevMalloc(&p, 512), 0);
    cr_assert_eq(simdevMemset(p, 0x11, 512), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        void *q;
        int ok = simdevMemcpy(b, p, 512, 2) == 0 && b[0] == 0x11 && b[511] == 0x11;
        ok = ok && simdevMemset(p, 0x22, 512) == 0;
        ok = ok && simdevMalloc(&q, 4096) == 0 && simdevMemset(q, 0x33, 4096) == 0;
        ok = ok && simdevMemcpy(b, q, 512, 2) == 0 && b[0] == 0x33;
        ok = ok && simdevFree(q) == 0 && simdevFree(p) == 0;
        _exit(ok ? 0 : 1);
    }
    cr_assert_eq(died_of(pid), 0, "the child could not use the device");
    cr_assert_eq(simdevMemcpy(b, p, 512, 2), 0, "the child's free did not free ours");
    for (int i = 0; i < 512; i++)
        cr_assert_eq(b[i], 0x11, "the child's writes reached the parent at %d", i);
    cr_assert_eq(free_bytes(), MiB - 512);
    cr_assert_eq(simdevFree(p), 0);
}

static size_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    unsigned long size, resident;
    cr_assert_eq(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return resident * (size_t)sysconf(_SC_PAGESIZE);
}

Test(simdev, freed_blocks_give_their_pages_back, .init = cap_64g)
{
    size_t before = rss_bytes();
    void *p[4];
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(simdevMalloc(&p[i], 32 * MiB + 100), 0);
        cr_assert_eq(simdevMemset(p[i], 0xee, 32 * MiB + 100), 0);
    }
    size_t written = rss_bytes();
    cr_assert_geq(written, before + 120 * MiB, "writing device memory commits it");
    for (int i = 0; i < 4; i++)
        cr_assert_eq(simdevFree(p[i]), 0);
    cr_assert_leq(rss_bytes(), before + 8 * MiB, "freeing gave the pages back");
}
