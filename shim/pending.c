/* Weak defaults for parts that land separately (leak hunting, python_gc,
 * Python stacks): the real definitions override these at link time. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "leak.h"
#include "pygc.h"
#include "pystack.h"

__attribute__((weak)) void shim_leak_init(void) {}
__attribute__((weak)) bool shim_leak_enabled(void) { return false; }
__attribute__((weak)) void shim_leak_capture(uint32_t *n, uint32_t *p) { *n = 0; *p = 0; }
__attribute__((weak)) void shim_leak_on_oom(const char *rt, size_t size) { (void)rt; (void)size; }
__attribute__((weak)) void shim_leak_at_exit(void) {}
__attribute__((weak)) void shim_pygc_init(void) {}
__attribute__((weak)) void shim_pygc_add_stats(spyreshim_stats *s) { (void)s; }
__attribute__((weak)) void shim_pygc_write_json(FILE *f) { (void)f; }
__attribute__((weak)) void shim_pygc_on_finalize(void (*fn)(void)) { (void)fn; }
__attribute__((weak)) void shim_pygc_atfork_child(void) {}
