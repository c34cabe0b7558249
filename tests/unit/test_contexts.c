/* The device layer with a runtime that has contexts (as CUDA's driver):
 * a device per context, the wait before freed blocks are reused covering
 * every live context of the device, what a failed wait does, and a
 * context's teardown (docs/cuda.md). The runtime is fake_runtime.h's with
 * a context per thread and a wait whose answer each test chooses. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "fake_runtime.h"
#include "options.h"

#define MB ((size_t)1 << 20)

/* The calling thread's context (0: none); contexts are small numbers. */
static __thread uintptr_t current = 1;
/* What a wait on context c answers, and how many waits each got. */
static int wait_answer[8];
static unsigned waits[8];

static int ctx_current_device(int *ordinal, uintptr_t *context)
{
    *ordinal = 0;
    *context = current;
    return current ? 0 : 201;
}

static int ctx_current_context(uintptr_t *context)
{
    *context = current;
    return current ? 0 : 201;
}

static int ctx_sync(int ordinal, uintptr_t context)
{
    (void)ordinal;
    cr_assert_lt(context, 8);
    waits[context]++;
    return wait_answer[context];
}

static shim_runtime ctx_rt = {
    .name = "ctxfake",
    .err_invalid = 1,
    .err_oom = 2,
    .alignment = 256,
    .real_malloc = fake_malloc,
    .real_free = fake_free,
    .real_mem_info = fake_mem_info,
    .current_device = ctx_current_device,
    .current_context = ctx_current_context,
    .sync_device = ctx_sync,
};

/* Each context may reserve 1 MiB: a freed block is the only room. */
static void limit_1m(void)
{
    setenv("SPYRESHIM_LIMIT", "1M", 1);
    setenv("SPYRESHIM_REGION_SIZE", "1M", 1);
    shim_options_reload();
    fake.capacity = 64 * MB;
    fake.next = FAKE_BASE;
}

static shim_device *device_of(uintptr_t context)
{
    current = context;
    shim_device *d;
    cr_assert_eq(shim_device_for_caller(&ctx_rt, &d), 0);
    return d;
}

static spyreshim_stats stats_of(shim_device *d)
{
    spyreshim_stats s = {.size = sizeof s};
    shim_device_add_stats(d, &s);
    return s;
}

Test(contexts, each_context_has_its_own_regions, .init = limit_1m)
{
    shim_device *a = device_of(1), *b = device_of(2);
    cr_assert_neq(a, b);
    cr_assert_str_eq(shim_device_name(a), "ctxfake:0");
    cr_assert_str_eq(shim_device_name(b), "ctxfake:0.1");
    void *pa, *pb;
    current = 1;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &pa, MB), 0);
    current = 2;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &pb, MB), 0,
                 "context 2 has a limit of its own");
    cr_assert_neq(pa, pb);
    /* A free finds its block whatever context is current, and with none. */
    current = 0;
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, pa), 0);
    current = 1;
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, pb), 0);
}

Test(contexts, the_wait_covers_every_live_context_the_shim_knows, .init = limit_1m)
{
    device_of(3); /* a context that allocates nothing is still known */
    void *p, *q;
    current = 1;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &p, MB), 0);
    current = 2;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &q, MB), 0);
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, p), 0, "context 1's block, freed from 2");
    current = 1;
    void *again;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &again, MB), 0);
    cr_assert_eq(again, p, "the freed block is the only room");
    cr_assert_geq(waits[1], 1);
    cr_assert_geq(waits[2], 1, "context 2 may have queued work on the block");
    cr_assert_geq(waits[3], 1);
    cr_assert_eq(waits[4], 0, "no context is made for the wait");
}

Test(contexts, a_failed_wait_keeps_the_blocks_pending, .init = limit_1m)
{
    current = 1;
    void *p, *q;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &p, MB), 0);
    wait_answer[1] = 999; /* e.g. during a graph capture: the device may still write it */
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, p), 0);
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &q, MB), 2,
                 "served a block the device may still write");
    spyreshim_stats s = stats_of(device_of(1));
    cr_assert_eq(s.failed_allocs, 1);
    wait_answer[1] = 0;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &q, MB), 0);
    cr_assert_eq(q, p, "kept, and reused once a wait covered it");
}

Test(contexts, a_wait_that_finds_the_context_gone_forgets_it, .init = limit_1m)
{
    current = 2;
    void *live, *p;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &live, MB / 2), 0);
    current = 1;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &p, MB), 0);
    wait_answer[2] = SHIM_SYNC_GONE; /* destroyed where the shim did not see it */
    unsigned released = fake.frees;
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, p), 0);
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &p, MB), 0);
    cr_assert_eq(fake.frees, released, "a region of the gone context was released");
    spyreshim_stats s = {.size = sizeof s};
    for (size_t i = 0; i < shim_device_count(); i++)
        shim_device_add_stats(shim_device_at(i), &s);
    cr_assert_eq(s.context_teardown_blocks, 1);
    cr_assert_eq(s.context_teardown_bytes, MB / 2);
    cr_assert_eq(s.used_bytes, MB);
}

Test(contexts, teardown_forgets_without_releasing_and_the_device_serves_the_next_context,
     .init = limit_1m)
{
    shim_device *a = device_of(1);
    void *p, *q;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &p, 4096), 0);
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &q, 8192), 0);
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, q), 0); /* pending */
    unsigned released = fake.frees, reserved = fake.mallocs;
    shim_device_context_gone(&ctx_rt, 1);
    cr_assert_eq(fake.frees, released, "the runtime frees a torn-down context's regions");
    spyreshim_stats s = stats_of(a);
    cr_assert_eq(s.context_teardown_blocks, 1);
    cr_assert_eq(s.context_teardown_bytes, 4096);
    cr_assert_eq(s.used_bytes, 0);
    cr_assert_eq(s.reserved_bytes, 0);
    cr_assert_eq(s.allocs, s.frees + s.context_teardown_blocks);
    /* The dead pointer: rejected, never passed to the runtime. */
    unsigned bad = fake.bad_frees;
    cr_assert_eq(shim_device_free_any(&ctx_rt, NULL, p), 1);
    cr_assert_eq(fake.bad_frees, bad);
    cr_assert_eq(fake.frees, released);
    /* A new context 5 takes the vacant device, with a region of its own. */
    shim_device *e = device_of(5);
    cr_assert_eq(e, a);
    cr_assert_str_eq(shim_device_name(e), "ctxfake:0");
    void *r;
    cr_assert_eq(shim_device_malloc_current(&ctx_rt, &r, 4096), 0);
    cr_assert_eq(fake.mallocs, reserved + 1);
}
