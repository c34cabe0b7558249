/* Live allocations: device pointer -> the arena node of its block (what
 * else a live block carries, its sequence number and stack ids, the arena
 * keeps by node: shim_arena_set_stamp, shim_arena_set_tags). Open
 * addressing with linear probing and backward-shift deletion, load factor
 * kept under 3/4, so insert, find and remove are O(1). Host memory only.
 * Not thread-safe: the owner serializes calls with the allocator lock
 * (shim_table_prefetch excepted). */
#ifndef SHIM_TABLE_H
#define SHIM_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHIM_TABLE_NONE UINT32_MAX

/* A live block as reports see it: assembled from the table and the arena
 * (shim_device_live). */
typedef struct shim_record {
    uintptr_t ptr;
    uint64_t size;           /* bytes the program asked for */
    uint64_t seq;            /* allocation sequence number */
    uint32_t node;           /* arena block handle */
    uint32_t native_stack;   /* interned stack id, 0 = none */
    uint32_t python_stack;   /* interned stack id, 0 = none */
    uint32_t flags;
} shim_record;

/* The address of live node `id`: the table stores node ids only and asks
 * the owner for a candidate's address to confirm a match (the node is the
 * line a free touches next anyway). */
typedef uintptr_t (*shim_table_key_fn)(const void *ctx, uint32_t id);

typedef struct shim_table shim_table;

shim_table *shim_table_create(size_t initial_capacity, shim_table_key_fn key, const void *ctx);
void shim_table_destroy(shim_table *t);
/* Inserts `ptr` (key(id) must be ptr; 0 is never stored), or overwrites
 * its id. Returns 0, or -1 if growing failed. */
int shim_table_insert(shim_table *t, uintptr_t ptr, uint32_t id);
/* Inserts `ptr`, known not to be in the table (the arena just handed the
 * block out): no search for an entry to overwrite. 0, or -1 if growing
 * failed. */
int shim_table_add(shim_table *t, uintptr_t ptr, uint32_t id);
/* Removes `ptr`, returning its node id, or SHIM_TABLE_NONE when absent. */
uint32_t shim_table_remove(shim_table *t, uintptr_t ptr);
/* The node id of `ptr`, or SHIM_TABLE_NONE. */
uint32_t shim_table_find(const shim_table *t, uintptr_t ptr);
size_t shim_table_count(const shim_table *t);
/* Visits every live entry; `fn` must not modify the table. */
void shim_table_foreach(const shim_table *t, void (*fn)(uintptr_t ptr, uint32_t id, void *user),
                        void *user);
/* Host bytes the table's arrays take (mapped, not all resident). */
size_t shim_table_meta_bytes(const shim_table *t);
/* Without the lock: starts loading the line where `ptr` would be found, so
 * that the miss overlaps taking the lock. A hint only: it reads nothing it
 * acts on and may touch a stale array (a prefetch never faults). */
void shim_table_prefetch(const shim_table *t, uintptr_t ptr);

#endif
