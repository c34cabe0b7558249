/* The futex kind of the allocator lock taken while the process has one
 * thread (a relaxed store, no atomics), then contended by a thread started
 * while it is held (a runtime's first call may start threads): the waiter
 * must wait, and the release, made with two threads, must wake it.
 * A plain program, not a Criterion suite: Criterion's workers always have
 * several threads, and only a fresh process starts with one. Exit 0 pass,
 * 1 fail, 77 skip (meson's code) when the C library gives no hint. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "sleeping.h"
#include "lock.h"

static spyreshim_lock lk;
static _Atomic pid_t waiter_tid;
static atomic_bool waiter_got;

static void *wait_for_it(void *arg)
{
    (void)arg;
    atomic_store(&waiter_tid, gettid());
    shim_lock_acquire(&lk);
    atomic_store(&waiter_got, true);
    shim_lock_release(&lk);
    return NULL;
}

#define CHECK(c, what)                                      \
    do {                                                    \
        if (!(c)) {                                         \
            fprintf(stderr, "lock_single: FAIL: %s\n", what); \
            return 1;                                       \
        }                                                   \
    } while (0)

int main(void)
{
    if (!shim_single_threaded()) {
        fprintf(stderr, "lock_single: SKIP: the C library does not say the process has one thread\n");
        return 77;
    }
    shim_lock_init_fast(&lk);
    shim_lock_acquire(&lk);
    CHECK(shim_lock_held_by_me(&lk), "the holder owns the lock");
    bool again = shim_lock_try(&lk);
    if (again)
        shim_lock_release(&lk);
    CHECK(!again, "a held lock cannot be taken again");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, wait_for_it, NULL) == 0, "thread start");
    CHECK(!shim_single_threaded(), "two threads now");
    while (!atomic_load(&waiter_tid) || !thread_sleeping(atomic_load(&waiter_tid))) {
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    CHECK(!atomic_load(&waiter_got), "the waiter waits while the lock is held");
    shim_lock_release(&lk);
    pthread_join(t, NULL);
    CHECK(atomic_load(&waiter_got), "the release woke the waiter");
    CHECK(shim_lock_try(&lk), "the lock is free after the waiter's release");
    shim_lock_release(&lk);
    puts("lock_single: ok");
    return 0;
}
