/* Native stack capture and interning (shim/stack.c). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stack.h"
#include "symbolize.h"

Test(stack, same_frames_same_id_and_round_trip)
{
    uintptr_t a[] = {0x1000, 0x2000, 0x3000};
    uintptr_t b[] = {0x1000, 0x2000, 0x3001};
    uint32_t ia = shim_stack_intern(a, 3), ib = shim_stack_intern(b, 3);
    cr_assert_neq(ia, 0);
    cr_assert_neq(ib, 0);
    cr_assert_neq(ia, ib);
    cr_assert_eq(shim_stack_intern(a, 3), ia);
    cr_assert_neq(shim_stack_intern(a, 2), ia, "a prefix is another stack");
    const uintptr_t *f = NULL;
    cr_assert_eq(shim_stack_frames(ia, &f), 3);
    cr_assert_eq(memcmp(f, a, sizeof a), 0);
    cr_assert_eq(shim_stack_frames(0, &f), 0);
    cr_assert_eq(shim_stack_frames(999999, &f), 0);
    cr_assert_eq(shim_stack_intern(a, 0), 0);
}

/* Many distinct stacks force the index to grow several times; every id must
 * keep its frames and be found again. */
Test(stack, many_stacks_survive_growth)
{
    unsigned seed = (unsigned)time(NULL);
    printf("stack.many_stacks_survive_growth seed=%u\n", seed);
    srand(seed);
    enum { N = 50000 };
    static uintptr_t frames[N][8];
    static uint32_t ids[N];
    for (size_t i = 0; i < N; i++) {
        for (size_t k = 0; k < 8; k++)
            frames[i][k] = ((uintptr_t)rand() << 20) ^ (uintptr_t)rand();
        frames[i][0] = i + 1;                   /* distinct for sure */
        ids[i] = shim_stack_intern(frames[i], 1 + i % 8);
        cr_assert_neq(ids[i], 0);
    }
    cr_assert_geq(shim_stack_count(), N);
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq(shim_stack_intern(frames[i], 1 + i % 8), ids[i], "seed=%u i=%zu", seed, i);
        const uintptr_t *f;
        cr_assert_eq(shim_stack_frames(ids[i], &f), 1 + i % 8);
        cr_assert_eq(memcmp(f, frames[i], (1 + i % 8) * sizeof(uintptr_t)), 0);
    }
}

/* Threads interning the same stacks concurrently agree on one id each. */
enum { THREADS = 8, SHARED = 4000 };
static uint32_t seen[THREADS][SHARED];

static void *intern_all(void *arg)
{
    size_t t = (size_t)arg;
    for (size_t k = 0; k < SHARED; k++) {
        size_t i = (k * 7 + t * 131) % SHARED;  /* each thread its own order */
        uintptr_t f[4] = {0xabc000 + i, 0xdef000 + i, i, 42};
        seen[t][i] = shim_stack_intern(f, 4);
    }
    return NULL;
}

Test(stack, concurrent_interning_agrees)
{
    pthread_t th[THREADS];
    for (size_t t = 0; t < THREADS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, intern_all, (void *)t), 0);
    for (size_t t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    for (size_t i = 0; i < SHARED; i++) {
        cr_assert_neq(seen[0][i], 0);
        for (size_t t = 1; t < THREADS; t++)
            cr_assert_eq(seen[t][i], seen[0][i], "stack %zu: thread %zu got another id", i, t);
    }
    cr_assert_eq(shim_stack_count(), SHARED);
}

__attribute__((noinline)) static uint32_t capture_here(void)
{
    uint32_t id = shim_stack_capture(32);
    __asm__ volatile("" ::: "memory");          /* keep the call a call */
    return id;
}

__attribute__((noinline)) static uint32_t capture_elsewhere(void)
{
    uint32_t id = shim_stack_capture(32);
    __asm__ volatile("" ::: "memory");
    return id;
}

__attribute__((noinline)) static void capture_n(uint32_t *ids, int n)
{
#if defined(__clang__)
#pragma clang loop unroll(disable)
#else
#pragma GCC unroll 1
#endif
    for (int i = 0; i < n; i++)
        ids[i] = capture_here();
}

Test(stack, capture_names_the_caller)
{
    cr_assert(shim_stack_init(), "libunwind.so.8 must be loadable");
    /* One call site, run three times (a loop of unknown trip count that
     * is not unrolled, so the site really is one). */
    uint32_t ids[3];
    volatile int n3 = 3;
    capture_n(ids, n3);
    cr_assert_eq(ids[1], ids[0], "the same call site gives the same id");
    cr_assert_eq(ids[2], ids[0], "the same call site gives the same id");
    uint32_t a = ids[0], b;
    b = capture_elsewhere();
    cr_assert_neq(a, 0);
    cr_assert_neq(a, b);
    const uintptr_t *f;
    size_t n = shim_stack_frames(a, &f);
    cr_assert_geq(n, 2);
    shim_symbolizer *s = shim_symbolizer_create();
    shim_symbol sym;
    shim_symbolize(s, f[0], &sym);
    cr_assert_not_null(sym.function);
    cr_assert_str_eq(sym.function, "capture_here");
    cr_assert_not_null(sym.file, "the test is built with debug information");
    cr_assert(strstr(sym.file, "test_stack.c"), "file %s", sym.file);
    cr_assert_gt(sym.line, 0);
    cr_assert_not_null(sym.object);
    shim_symbolizer_destroy(s);
}

Test(stack, depth_is_bounded)
{
    cr_assert(shim_stack_init());
    uint32_t id = shim_stack_capture(1);
    const uintptr_t *f;
    cr_assert_eq(shim_stack_frames(id, &f), 1);
    cr_assert_eq(shim_stack_capture(0), 0);
}
