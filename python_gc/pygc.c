/* The Python GC pressure callback (first version: interface only; the
 * collection itself follows). */
#include "pygc.h"

void shim_pygc_init(void) {}
void shim_pygc_add_stats(spyreshim_stats *s) { (void)s; }
void shim_pygc_write_json(FILE *f) { (void)f; }
void shim_pygc_on_finalize(void (*fn)(void)) { (void)fn; }
void shim_pygc_atfork_child(void) {}
