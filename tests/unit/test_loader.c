/* The loader gateway (shim/base/loader.c): a loader call made while the
 * thread holds a shim lock aborts in debug builds; without one it works.
 * Also the per-thread count the check reads (shim/base/mutex.c). */
#include <criterion/criterion.h>
#include <signal.h>

#include "loader.h"
#include "lock.h"
#include "mutex.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

Test(loader, counts_every_shim_lock)
{
    spyreshim_lock l;
    shim_lock_init(&l);
    cr_assert_eq(shim_locks_held(), 0);
    shim_mutex_lock(&mu);
    shim_lock_acquire(&l);
    cr_assert_eq(shim_locks_held(), 2);
    shim_lock_release(&l);
    shim_mutex_unlock(&mu);
    cr_assert_eq(shim_locks_held(), 0);
}

Test(loader, calls_through_without_a_lock)
{
    cr_assert_not_null(shim_dlsym(RTLD_DEFAULT, "malloc"));
    Dl_info di;
    cr_assert(shim_dladdr((void *)&malloc, &di));
}

#ifndef NDEBUG
Test(loader, aborts_with_a_shim_mutex_held, .signal = SIGABRT)
{
    shim_mutex_lock(&mu);
    shim_dlsym(RTLD_DEFAULT, "malloc");
}

Test(loader, aborts_with_the_allocator_lock_held, .signal = SIGABRT)
{
    spyreshim_lock l;
    shim_lock_init(&l);
    shim_lock_acquire(&l);
    Dl_info di;
    shim_dladdr((void *)&malloc, &di);
}
#endif
