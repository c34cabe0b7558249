/* Library lifecycle: what runs when libspyreshim.so is loaded and when the
 * process exits. Loading must cost nothing measurable and print nothing in
 * a process that never touches a device runtime: options are parsed (cheap)
 * and everything else waits for the first intercepted call. */
#include "control.h"
#include "fork.h"
#include "leak.h"
#include "log.h"
#include "options.h"
#include "pygc.h"
#include "rank.h"
#include "stats.h"
#include "trace.h"

__attribute__((constructor)) static void shim_init(void)
{
    const shim_options *o = shim_opts();
    (void)shim_rank_get();   /* the launcher's variables, before the program can change them */
    if (o->log_level == SHIM_LOG_DEBUG)
        shim_options_dump(2);
    shim_fork_init();
    shim_pygc_init();
    shim_leak_init();
    shim_trace_init();
    shim_control_init();
}

/* Runs after main returned or exit() was called, so after an embedded
 * interpreter has finalized. The verdict on the last out-of-memory comes
 * before the leak report, which comes last: it may end the
 * process with SPYRESHIM_EXITCODE. */
__attribute__((destructor)) static void shim_fini(void)
{
    shim_stats_at_exit();
    shim_trace_at_exit();
    shim_leak_oom_at_exit();
    shim_leak_at_exit();
}
