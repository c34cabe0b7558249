/* The Python stack that started work other threads run (origin.c). */
#ifndef SHIM_LEAK_ORIGIN_H
#define SHIM_LEAK_ORIGIN_H

#include <stdint.h>

/* The interned origin stack (SHIM_PYSTACK_ORIGIN) of the one piece of
 * handed-off work running now, 0 when none runs or several do. */
uint32_t shim_origin_current(void);
/* In a child after fork(): nothing runs there yet. */
void shim_origin_atfork_child(void);

#endif
