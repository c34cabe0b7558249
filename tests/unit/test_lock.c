/* The allocator lock's futex kind (an arena's lock): mutual exclusion
 * between real threads, try semantics, the owner test, and a lock taken
 * while the process had one thread (no atomics then) that a thread
 * started afterwards must still wait for and be woken from. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sleeping.h"
#include "lock.h"

#define THREADS 4
#define ROUNDS 200000

static spyreshim_lock lk;
static unsigned long counter; /* guarded by lk only: a broken lock loses increments */

static void *hammer(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        shim_lock_acquire(&lk);
        counter++;
        shim_lock_release(&lk);
    }
    return NULL;
}

Test(lock, fast_kind_excludes_threads)
{
    shim_lock_init_fast(&lk);
    counter = 0;
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(counter, (unsigned long)THREADS * ROUNDS);
    cr_assert(shim_lock_try(&lk), "free again after every release");
    shim_lock_release(&lk);
}

struct probe {
    bool tried, got, mine;
};

static void *try_once(void *arg)
{
    struct probe *p = arg;
    p->got = shim_lock_try(&lk);
    p->mine = shim_lock_held_by_me(&lk);
    p->tried = true;
    if (p->got)
        shim_lock_release(&lk);
    return NULL;
}

Test(lock, fast_try_fails_while_held_and_the_owner_is_known)
{
    shim_lock_init_fast(&lk);
    shim_lock_acquire(&lk);
    cr_assert(shim_lock_held_by_me(&lk));
    struct probe p = { 0 };
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, try_once, &p), 0);
    pthread_join(t, NULL);
    cr_assert(p.tried && !p.got, "a try on a held lock fails");
    cr_assert(!p.mine, "another thread's lock is not mine");
    shim_lock_release(&lk);
    cr_assert(!shim_lock_held_by_me(&lk));
    p = (struct probe){ 0 };
    cr_assert_eq(pthread_create(&t, NULL, try_once, &p), 0);
    pthread_join(t, NULL);
    cr_assert(p.got && p.mine, "a try on a free lock succeeds and owns it");
}

struct waiter {
    _Atomic pid_t tid;
    atomic_bool got;
};

static void *wait_for_it(void *arg)
{
    struct waiter *w = arg;
    atomic_store(&w->tid, gettid());
    shim_lock_acquire(&lk);
    atomic_store(&w->got, true);
    shim_lock_release(&lk);
    return NULL;
}

/* The lock is taken first (with no atomics when this process has one
 * thread then); a thread started afterwards finds it held, spins, sleeps;
 * the release, made once the process has two threads, must wake it. */
Test(lock, a_waiter_that_came_after_the_lock_was_taken_is_woken)
{
    shim_lock_init_fast(&lk);
    bool single = shim_single_threaded();
    cr_log_info("lock taken %s", single ? "single-threaded (no atomics)" : "multi-threaded");
    shim_lock_acquire(&lk);
    struct waiter w = { 0 };
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, wait_for_it, &w), 0);
    cr_assert(!shim_single_threaded(), "two threads now");
    while (!atomic_load(&w.tid) || !thread_sleeping(atomic_load(&w.tid))) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    cr_assert(!atomic_load(&w.got), "the waiter waits while the lock is held");
    shim_lock_release(&lk);
    pthread_join(t, NULL);
    cr_assert(atomic_load(&w.got), "the release woke the waiter");
    cr_assert(shim_lock_try(&lk), "and the lock is free after its release");
    shim_lock_release(&lk);
}
