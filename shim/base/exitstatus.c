/* The program's exit status (exitstatus.h): one on_exit(3) handler, which
 * the C library passes the status of exit(3), whether the program called
 * it or returned from main.
 *
 * Why not from the constructor: exit handlers run in the reverse order of
 * their registration, and the shim's destructor runs in the loader's own
 * handler (_dl_fini), which __libc_start_main registers after the
 * constructors of preloaded objects ran. A handler registered there would
 * run after the destructor, too late. Registered once the program runs
 * (the first allocation the leak check records), it runs before _dl_fini,
 * after every handler the program registered since. Registered too early
 * (an allocation in a constructor that ran before __libc_start_main), it
 * has not run when the destructor asks: the status is then not known, and
 * the verdict behaves as it did without it.
 *
 * State: two atomics, written by the handler and read by the destructor
 * on the exiting thread. Never touches the status itself. */
#include "exitstatus.h"

#include <stdatomic.h>
#include <stdlib.h>

static atomic_bool watched;
static atomic_bool known;
static atomic_int status_seen;

static void on_exit_handler(int status, void *arg)
{
    (void)arg;
    atomic_store(&status_seen, status);
    atomic_store(&known, true);
}

void shim_exitstatus_watch(void)
{
    if (atomic_load_explicit(&watched, memory_order_relaxed) || atomic_exchange(&watched, true))
        return;
    /* Out of memory for the list's next block: the status stays unknown. */
    (void)on_exit(on_exit_handler, NULL);
}

bool shim_exitstatus_get(int *status)
{
    if (!atomic_load(&known))
        return false;
    *status = atomic_load(&status_seen);
    return true;
}
