/* The fork gate (forkgate.h).
 *
 * Owns `walkers` (threads inside a gated walk) and `pending` (a fork is
 * between prepare and parent/child). No lock: two sequentially consistent
 * atomics, Dekker style. A walker announces itself, then looks for a
 * pending fork; prepare announces the fork, then looks for walkers. At
 * least one of them sees the other, so a fork never proceeds (within its
 * bound) while a walk is in flight, and a walk never starts while a fork
 * is pending (within the walker's bound).
 *
 * Both waits are bounded (GATE_WAIT_MS): the forking thread runs other
 * prepare handlers too, and a walker may wait for the loader's lock held by
 * a thread that waits for an allocator lock a device's prepare took. Past
 * the bound the fork (or the walk) proceeds as it would without the gate,
 * and a debug line says so. Must never take a lock or call the loader.
 * Locks, their order and fork: docs/locking.md. */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"
#include "forkgate.h"
#include "log.h"
#include "mutex.h"

#define GATE_WAIT_MS 1000
#define POLL_NS 50000

static _Atomic unsigned walkers;
static _Atomic bool pending;
/* initial-exec: read on every unwind, and a __tls_get_addr call otherwise. */
static __thread unsigned depth __attribute__((tls_model("initial-exec")));
/* Whether this thread's outermost walk counts in `walkers`. */
static __thread bool counted __attribute__((tls_model("initial-exec")));

static uint64_t now_ms(void)
{
    return shim_now_ns() / 1000000u;
}

static void pause_briefly(void)
{
    struct timespec p = {0, POLL_NS};
    nanosleep(&p, NULL);
}

void shim_fork_gate_enter(void)
{
    if (depth++)
        return;
    /* One thread: no other can fork during the walk (and none can start
     * before it ends), so nothing needs counting; two lock-prefixed
     * operations per allocation saved. */
    counted = !shim_single_threaded();
    if (!counted)
        return;
    uint64_t deadline = 0;
    for (;;) {
        atomic_fetch_add(&walkers, 1);
        if (!atomic_load(&pending))
            return;
        atomic_fetch_sub(&walkers, 1);
        uint64_t now = now_ms();
        if (!deadline)
            deadline = now + GATE_WAIT_MS;
        if (now >= deadline) {
            shim_debug("fork gate: a fork stayed pending for %d ms; walking anyway", GATE_WAIT_MS);
            atomic_fetch_add(&walkers, 1);
            return;
        }
        pause_briefly();
    }
}

void shim_fork_gate_leave(void)
{
    if (depth && --depth == 0 && counted)
        atomic_fetch_sub(&walkers, 1);
}

void shim_fork_gate_prepare(void)
{
    atomic_store(&pending, true);
    /* The forking thread may itself be inside a walk (a fork from a loader
     * callback): it does not wait for itself. */
    unsigned mine = depth && counted ? 1 : 0;
    uint64_t deadline = 0;
    while (atomic_load(&walkers) > mine) {
        uint64_t now = now_ms();
        if (!deadline)
            deadline = now + GATE_WAIT_MS;
        if (now >= deadline) {
            shim_debug("fork gate: a walk of the loaded objects outlasted %d ms; forking anyway",
                       GATE_WAIT_MS);
            return;
        }
        pause_briefly();
    }
}

void shim_fork_gate_parent(void)
{
    atomic_store(&pending, false);
}

void shim_fork_gate_child(void)
{
    /* Only the forking thread exists here. */
    atomic_store(&walkers, depth && counted ? 1 : 0);
    atomic_store(&pending, false);
}
