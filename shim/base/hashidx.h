/* One open-addressing index: 32-bit ids (never 0) keyed by a 64-bit hash,
 * the caller deciding equality, for every hash table of the shim whose
 * entries live elsewhere (native stacks, the symbol cache, Python frames
 * and stacks). Insert-only: none of its users forgets an entry.
 *
 * Readers may run without the writer's lock (SHIM_HASHIDX_LOCKFREE): slots
 * are atomic, a grown table is published with a release store, and the
 * tables it replaces are kept alive (a geometric series of memory) because
 * a reader may still be probing one. A reader that misses in a superseded
 * table must look again under the writer's lock before concluding the key
 * is absent (stack.c does). Writers are serialized by their owner. */
#ifndef SHIM_HASHIDX_H
#define SHIM_HASHIDX_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether entry `id` (with hash `hash`) is `key`. May be called without
 * the writer's lock in lock-free mode: it must then read only what was
 * published before the id was inserted. */
typedef bool (*shim_hashidx_eq_fn)(const void *ctx, uint32_t id, uint64_t hash, const void *key);
/* The hash of entry `id`, to place it again when the index grows (writer
 * side only). */
typedef uint64_t (*shim_hashidx_hash_fn)(const void *ctx, uint32_t id);

typedef struct shim_hashidx_table shim_hashidx_table;

typedef struct shim_hashidx {
    _Atomic(shim_hashidx_table *) cur;
    size_t count;
    shim_hashidx_hash_fn hash_of;
    shim_hashidx_eq_fn eq;
    const void *ctx;
    bool lockfree;           /* keep superseded tables alive for readers */
} shim_hashidx;

/* Static or runtime initializer; the first table is made on first reserve. */
#define SHIM_HASHIDX_INIT(hash_fn, eq_fn, context, lock_free)                              \
    { .cur = NULL, .count = 0, .hash_of = (hash_fn), .eq = (eq_fn), .ctx = (context),      \
      .lockfree = (lock_free) }
#define SHIM_HASHIDX_LOCKFREE true

/* The id whose entry equals `key`, or 0. Safe without the writer's lock in
 * lock-free mode (see above for a miss). */
uint32_t shim_hashidx_find(const shim_hashidx *x, uint64_t hash, const void *key);
/* Writer: makes sure `n` more ids can be inserted without failing (load
 * kept <= 1/2). false when out of memory (nothing changed). */
bool shim_hashidx_reserve(shim_hashidx *x, size_t n);
/* Writer: adds `id` (not 0, not present) under `hash`, after a reserve. */
void shim_hashidx_insert(shim_hashidx *x, uint64_t hash, uint32_t id);
size_t shim_hashidx_count(const shim_hashidx *x);
/* Frees every table, superseded ones included; only with no reader left. */
void shim_hashidx_destroy(shim_hashidx *x);

#endif
