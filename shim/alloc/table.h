/* Live allocations: device pointer -> record. Open addressing with linear
 * probing and backward-shift deletion, load factor kept under 1/2, so
 * insert, find and remove are O(1). Host memory only. Not thread-safe: the
 * owner serializes calls with the allocator lock. */
#ifndef SHIM_TABLE_H
#define SHIM_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct shim_record {
    uintptr_t ptr;           /* key; 0 never stored */
    uint64_t size;           /* bytes the program asked for */
    uint64_t seq;            /* allocation sequence number */
    uint32_t node;           /* arena block handle */
    uint32_t native_stack;   /* interned stack id, 0 = none */
    uint32_t python_stack;   /* interned stack id, 0 = none */
    uint32_t flags;
} shim_record;

typedef struct shim_table shim_table;

shim_table *shim_table_create(size_t initial_capacity);
void shim_table_destroy(shim_table *t);
/* Inserts (or overwrites) rec->ptr. Returns 0, or -1 if growing failed. */
int shim_table_insert(shim_table *t, const shim_record *rec);
/* Removes `ptr`, copying its record to *out. false when absent. */
bool shim_table_remove(shim_table *t, uintptr_t ptr, shim_record *out);
const shim_record *shim_table_find(const shim_table *t, uintptr_t ptr);
size_t shim_table_count(const shim_table *t);
/* Visits every record; `fn` must not modify the table. */
void shim_table_foreach(const shim_table *t, void (*fn)(const shim_record *, void *), void *user);

#endif
