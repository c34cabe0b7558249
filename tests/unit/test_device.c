/* The device layer's behaviour at its edges: bad frees, foreign pointers,
 * the limit, the memory-info view, size 0, fork. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fake_runtime.h"
#include "options.h"
#include "pressure.h"

#define MB ((size_t)1 << 20)

static spyreshim_stats stats_of(shim_device *d)
{
    spyreshim_stats s = {.size = sizeof s};
    shim_device_add_stats(d, &s);
    return s;
}

Test(device, double_free_and_interior_pointer_are_rejected_and_state_survives)
{
    shim_device *d = fake_device(256 * MB);
    void *a, *b;
    cr_assert_eq(shim_device_malloc(d, &a, MB), 0);
    cr_assert_eq(shim_device_malloc(d, &b, MB), 0);
    cr_assert_eq(shim_device_free(d, (char *)b + 256), 1, "interior pointer accepted");
    cr_assert_eq(shim_device_free(d, a), 0);
    cr_assert_eq(shim_device_free(d, a), 1, "double free accepted");
    spyreshim_stats s = stats_of(d);
    cr_assert_eq(s.invalid_frees, 2);
    cr_assert_eq(s.used_bytes, MB);
    cr_assert_eq(fake.bad_frees, 0, "a bad pointer reached the runtime");
    /* The allocator still works and b is intact. */
    cr_assert_eq(shim_device_malloc(d, &a, MB), 0);
    cr_assert_neq(a, b);
    cr_assert_eq(shim_device_free(d, b), 0);
    cr_assert_eq(shim_device_free(d, a), 0);
    cr_assert_eq(stats_of(d).used_bytes, 0);
}

Test(device, foreign_pointer_is_passed_to_the_real_free)
{
    shim_device *d = fake_device(256 * MB);
    void *mine;
    cr_assert_eq(shim_device_malloc(d, &mine, MB), 0);
    void *foreign;
    cr_assert_eq(fake_malloc(&foreign, 4096), 0); /* allocated behind the shim's back */
    unsigned frees = fake.frees;
    cr_assert_eq(shim_device_free(d, foreign), 0);
    cr_assert_eq(fake.frees, frees + 1);
    cr_assert_eq(stats_of(d).foreign_frees, 1);
    cr_assert_eq(shim_device_free(d, NULL), 0);
}

static void limit_64m(void)
{
    setenv("SPYRESHIM_LIMIT", "64M", 1);
    shim_options_reload();
}

Test(device, limit_serves_close_to_the_limit_and_no_more, .init = limit_64m)
{
    shim_device *d = fake_device((size_t)1 << 30);
    void *p;
    size_t n = 0;
    while (shim_device_malloc(d, &p, MB) == 0)
        n++;
    cr_assert_geq(n, 60, "only %zu MiB served under a 64 MiB limit", n);
    cr_assert_leq(n, 64);
    spyreshim_stats s = stats_of(d);
    cr_assert_leq(s.peak_reserved_bytes, 64 * MB);
    size_t f, t;
    cr_assert_eq(shim_device_mem_info(d, &f, &t), 0);
    cr_assert_eq(t, 64 * MB);
    cr_assert_leq(f, t);
    cr_assert_lt(f, MB, "free %zu reported while 1 MiB requests fail", f);
}

Test(device, mem_info_never_exceeds_the_runtime)
{
    shim_device *d = fake_device(128 * MB);
    size_t f, t;
    cr_assert_eq(shim_device_mem_info(d, &f, &t), 0);
    cr_assert_eq(t, 128 * MB);
    cr_assert_leq(f, t);
    void *p;
    cr_assert_eq(shim_device_malloc(d, &p, 10 * MB), 0);
    cr_assert_eq(shim_device_mem_info(d, &f, &t), 0);
    cr_assert_leq(f, 118 * MB);
    cr_assert_geq(f, 100 * MB);
    cr_assert_eq(shim_device_mem_info(d, NULL, &t), 1);
}

Test(device, zero_size_behaves_as_the_runtime)
{
    shim_device *d = fake_device(128 * MB);
    void *p = (void *)1;
    cr_assert_eq(shim_device_malloc(d, &p, 0), 0);
    cr_assert_null(p);
    cr_assert_eq(shim_device_malloc(d, NULL, 16), 1);
    cr_assert_eq(stats_of(d).allocs, 0);
}

Test(device, blocks_are_aligned_and_distinct)
{
    shim_device *d = fake_device(512 * MB);
    void *p[64];
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(shim_device_malloc(d, &p[i], 1000 + (size_t)i * 4099), 0);
        cr_assert_eq((uintptr_t)p[i] % 256, 0);
        for (int j = 0; j < i; j++)
            cr_assert_neq(p[i], p[j]);
    }
    cr_assert_eq(stats_of(d).allocs, 64);
}

Test(device, fork_child_can_allocate_and_free)
{
    shim_device *d = fake_device(256 * MB);
    void *p;
    cr_assert_eq(shim_device_malloc(d, &p, MB), 0);
    pid_t pid = fork();
    if (pid == 0) {
        void *q;
        int ok = shim_device_malloc(d, &q, MB) == 0 && shim_device_free(d, q) == 0 &&
                 shim_device_free(d, p) == 0;
        _exit(ok ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    cr_assert_eq(shim_device_free(d, p), 0);
}

/* A free leaves its block's arena work for the shard's next use (the fast
 * path's deferral): nothing a caller can see may tell. */
Test(device, a_free_shows_at_once_in_statistics_memory_info_and_freed_bytes)
{
    shim_device *d = fake_device(256 * MB);
    size_t f0, f1, t;
    void *keep, *p;
    cr_assert_eq(shim_device_malloc(d, &keep, MB), 0);
    cr_assert_eq(shim_device_mem_info(d, &f0, &t), 0);
    cr_assert_eq(shim_device_malloc(d, &p, 8 * MB), 0);
    uint64_t freed = shim_pressure_freed_total();
    cr_assert_eq(shim_device_free(d, p), 0);
    cr_assert_eq(shim_pressure_freed_total() - freed, 8 * MB, "the free not counted yet");
    cr_assert_eq(shim_device_mem_info(d, &f1, &t), 0);
    cr_assert_eq(f1, f0, "memory info still counts the freed block");
    spyreshim_stats s = stats_of(d);
    cr_assert_eq(s.frees, 1);
    cr_assert_eq(s.used_bytes, MB);
    cr_assert_eq(shim_device_free(d, p), 1, "a second free of it accepted");
}

Test(device, the_peak_never_counts_a_block_already_freed)
{
    shim_device *d = fake_device(256 * MB);
    void *p;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(shim_device_malloc(d, &p, 8 * MB), 0);
        cr_assert_eq(shim_device_free(d, p), 0);
    }
    cr_assert_eq(shim_device_malloc(d, &p, 8 * MB), 0);
    spyreshim_stats s = stats_of(d);
    cr_assert_eq(s.peak_used_bytes, 8 * MB);
    cr_assert_eq(s.used_bytes, 8 * MB);
}

/* The shard keeps the arena work of its last few frees for later (several
 * once it holds more than 65,536 live blocks): after any number of frees
 * in a row, and allocations between them, the counters are exact and the
 * peak counts no block already freed. */
Test(device, frees_in_a_row_show_at_once_and_the_peak_counts_none_of_them)
{
    /* Regions of 64 MiB: every allocation below fits in free room, so none
     * has to settle the frees to find a block. */
    shim_device *d = fake_device(4096 * MB);
    enum { MANY = 70000 };
    void **many = malloc(MANY * sizeof *many);
    cr_assert_not_null(many);
    for (int i = 0; i < MANY; i++)
        cr_assert_eq(shim_device_malloc(d, &many[i], 256), 0);
    uint64_t base = MANY * 256;
    void *p[20];
    for (int i = 0; i < 20; i++)
        cr_assert_eq(shim_device_malloc(d, &p[i], MB), 0);
    uint64_t freed = shim_pressure_freed_total();
    for (int i = 0; i < 12; i++) {
        cr_assert_eq(shim_device_free(d, p[i]), 0);
        cr_assert_eq(shim_pressure_freed_total() - freed, (uint64_t)(i + 1) * MB);
        spyreshim_stats s = stats_of(d);
        cr_assert_eq(s.frees, (uint64_t)i + 1);
        cr_assert_eq(s.used_bytes, base + (uint64_t)(19 - i) * MB);
    }
    for (int i = 0; i < 12; i++)
        cr_assert_eq(shim_device_malloc(d, &p[i], MB), 0);
    /* Nothing looks at the counters between these frees and allocations. */
    for (int i = 0; i < 12; i++)
        cr_assert_eq(shim_device_free(d, p[i]), 0);
    for (int i = 0; i < 12; i++)
        cr_assert_eq(shim_device_malloc(d, &p[i], MB), 0);
    spyreshim_stats s = stats_of(d);
    cr_assert_eq(s.used_bytes, base + 20 * MB);
    cr_assert_eq(s.peak_used_bytes, base + 20 * MB, "a freed block counted in the peak");
    for (int i = 0; i < 20; i++)
        cr_assert_eq(shim_device_free(d, p[i]), 0);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(shim_device_free(d, p[i]), 1, "a second free of it accepted");
    cr_assert_eq(stats_of(d).used_bytes, base);
    for (int i = 0; i < MANY; i++)
        cr_assert_eq(shim_device_free(d, many[i]), 0);
    cr_assert_eq(stats_of(d).used_bytes, 0);
    free(many);
}

/* A block just freed is there for the next request: no region beyond the
 * first one is reserved for a loop that frees and reallocates the same
 * size, even when the runtime could give one. */
Test(device, a_block_just_freed_is_reused_before_a_region_is_reserved)
{
    shim_device *d = fake_device(1024 * MB);
    void *p;
    cr_assert_eq(shim_device_malloc(d, &p, 40 * MB), 0);
    uint64_t regions = stats_of(d).regions_reserved;
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(shim_device_free(d, p), 0);
        cr_assert_eq(shim_device_malloc(d, &p, 40 * MB), 0);
    }
    cr_assert_eq(stats_of(d).regions_reserved, regions);
}
