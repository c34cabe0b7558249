/* Per-thread live bytes (shim/alloc/thread_live.c): what a counted thread
 * allocated, freed by whichever thread, its peak since its reset; threads
 * not counted and blocks allocated before the count began leave it alone;
 * a counted thread's slot is given back once it exited and its blocks are
 * freed. On the simulated device, through the device's own paths. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>

#include "device.h"
#include "spyreshim.h"
#include "thread_live.h"

int simdevMalloc(void **ptr, size_t size);
int simdevFree(void *ptr);
int simdevMemGetInfo(size_t *free, size_t *total);

static shim_runtime simdev_rt = {
    .name = "simdev", .err_invalid = 1, .err_oom = 2, .alignment = 256,
    .real_malloc = simdevMalloc, .real_free = simdevFree, .real_mem_info = simdevMemGetInfo,
};

#define MIB ((size_t)1 << 20)

static shim_device *dev;

static void *alloc(size_t n)
{
    void *p = NULL;
    cr_assert_eq(shim_device_malloc(dev, &p, n), 0);
    return p;
}

static void *free_it(void *p)
{
    cr_assert_eq(shim_device_free(dev, p), 0);
    return NULL;
}

static void *alloc_on_another_thread(void *arg)
{
    *(void **)arg = alloc(16 * MIB);
    return NULL;
}

static void on_another_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    pthread_join(t, NULL);
}

Test(thread_live, counts_the_threads_own_blocks_whoever_frees_them)
{
    dev = shim_device_get(&simdev_rt);
    cr_assert_not_null(dev);
    void *before = alloc(MIB);               /* before the count began */
    cr_assert_eq(spyreshim_thread_used(), 0);
    cr_assert_eq(spyreshim_thread_peak(), 0);
    cr_assert_eq(spyreshim_thread_reset_peak(), 0);
    void *a = alloc(2 * MIB), *b = alloc(3 * MIB);
    void *theirs = NULL;
    on_another_thread(alloc_on_another_thread, &theirs);   /* not this thread's */
    cr_assert_eq(spyreshim_thread_used(), 5 * MIB);
    cr_assert_eq(spyreshim_thread_peak(), 5 * MIB);
    on_another_thread(free_it, b);                          /* freed elsewhere */
    free_it(before);                                        /* never counted */
    free_it(theirs);
    cr_assert_eq(spyreshim_thread_used(), 2 * MIB);
    cr_assert_eq(spyreshim_thread_peak(), 5 * MIB);
    cr_assert_eq(spyreshim_thread_reset_peak(), 0);
    cr_assert_eq(spyreshim_thread_peak(), 2 * MIB);        /* restarts from what is live */
    void *c = alloc(MIB);
    cr_assert_eq(spyreshim_thread_peak(), 3 * MIB);
    free_it(c);
    free_it(a);
    cr_assert_eq(spyreshim_thread_used(), 0);
    cr_assert_eq(spyreshim_thread_peak(), 3 * MIB);
}

struct exiting {
    uint16_t slot;
    void *left;      /* a block still live when the thread exits */
};

static void *counted_then_gone(void *arg)
{
    struct exiting *e = arg;
    cr_assert_eq(spyreshim_thread_reset_peak(), 0);
    e->slot = shim_tls_thread_slot;
    e->left = e->left ? alloc(MIB) : NULL;
    return NULL;
}

Test(thread_live, a_slot_is_given_back_once_its_thread_and_blocks_are_gone)
{
    dev = shim_device_get(&simdev_rt);
    cr_assert_not_null(dev);
    struct exiting e = {0, NULL};
    on_another_thread(counted_then_gone, &e);
    cr_assert_neq(e.slot, 0);
    cr_assert_eq(atomic_load(&shim_thread_live_at(e.slot)->state), 0, "free at once: nothing live");
    struct exiting f = {0, (void *)1};
    on_another_thread(counted_then_gone, &f);
    cr_assert_neq(f.slot, 0);
    cr_assert_neq(atomic_load(&shim_thread_live_at(f.slot)->state), 0, "kept: a block is live");
    free_it(f.left);
    cr_assert_eq(atomic_load(&shim_thread_live_at(f.slot)->state), 0, "given back by the free");
    cr_assert_eq(atomic_load(&shim_thread_live_at(f.slot)->live), 0);
}

Test(thread_live, a_threads_snapshot_holds_its_own_blocks_alone)
{
    dev = shim_device_get(&simdev_rt);
    cr_assert_not_null(dev);
    spyreshim_snapshot *none = spyreshim_snapshot_take_thread(0);
    cr_assert_not_null(none);
    cr_assert_eq(spyreshim_snapshot_count(none), 0, "not counted: nothing is its");
    spyreshim_snapshot_free(none);
    cr_assert_eq(spyreshim_thread_reset_peak(), 0);
    spyreshim_mark m = spyreshim_mark_now();
    void *a = alloc(MIB), *b = alloc(2 * MIB);
    void *theirs = NULL;
    on_another_thread(alloc_on_another_thread, &theirs);
    spyreshim_snapshot *s = spyreshim_snapshot_take_thread(m);
    cr_assert_not_null(s);
    cr_assert_eq(spyreshim_snapshot_count(s), 2);
    cr_assert_eq(spyreshim_snapshot_bytes(s), 3 * MIB);
    spyreshim_snapshot_free(s);
    s = spyreshim_snapshot_take(m);
    cr_assert_eq(spyreshim_snapshot_bytes(s), 19 * MIB);
    spyreshim_snapshot_free(s);
    free_it(a);
    free_it(b);
    free_it(theirs);
}
