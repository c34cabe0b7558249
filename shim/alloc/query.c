/* Pointer queries: what the shim knows of an address of a runtime (a live
 * block with its start, size, id and context, a dead one, or none), for
 * the driver's pointer attributes and the hooks' range lookups; and
 * whether a block can be exported (alone in its region: IPC).
 *
 * Locks: each shard's lock in turn, its prefetched frees finished first.
 * Never dereferences the address. */
#include <stdatomic.h>
#include <stdint.h>

#include "device_internal.h"
#include "forgotten.h"

enum shim_block_state shim_device_block_info(const shim_runtime *rt, uintptr_t addr,
                                             shim_block_info *info)
{
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (!same_runtime(d, rt))
            continue;
        unsigned ns = shard_count(d);
        for (unsigned k = 0; k < ns; k++) {
            shim_shard *s = d->shards[k];
            bool taken = lock_with_frees_finished(d, s);
            enum shim_block_state st = SHIM_BLOCK_NONE;
            if (shim_arena_contains(s->arena, addr)) {
                /* Freed, waiting for the device, or slack: not the
                 * program's, whatever the region around it is. */
                st = SHIM_BLOCK_DEAD;
                uintptr_t start;
                uint32_t node = SHIM_TABLE_NONE;
                shim_live_fields f = {0};
                if (shim_arena_live_block_at(s->arena, addr, &start))
                    node = shim_table_find_fields(s->table, start, &f);
                size_t size = node != SHIM_TABLE_NONE ? shim_arena_block_requested(s->arena, node)
                                                      : 0;
                if (node != SHIM_TABLE_NONE && addr - start < size) {
                    st = SHIM_BLOCK_LIVE;
                    info->base = start;
                    info->size = size;
                    /* Apart from the driver's own buffer ids (small
                     * counters): the top bit set. */
                    info->id = shim_live_seq(&f) | (UINT64_C(1) << 63);
                    info->context = atomic_load_explicit(&d->context, memory_order_relaxed);
                    info->ordinal = d->ordinal;
                }
            }
            if (taken)
                shim_lock_release(&s->lock);
            if (st != SHIM_BLOCK_NONE)
                return st;
        }
    }
    return shim_forgotten_dead(rt, addr) ? SHIM_BLOCK_DEAD : SHIM_BLOCK_NONE;
}

int shim_device_block_range(const shim_runtime *rt, uintptr_t addr, uintptr_t *base, size_t *size)
{
    shim_block_info info;
    if (shim_device_block_info(rt, addr, &info) != SHIM_BLOCK_LIVE)
        return -1;
    *base = info.base;
    *size = info.size;
    return 0;
}

int shim_device_block_export(const shim_runtime *rt, uintptr_t addr, uintptr_t *base)
{
    shim_block_info info;
    if (shim_device_block_info(rt, addr, &info) != SHIM_BLOCK_LIVE)
        return -2;
    size_t n = shim_device_count();
    for (size_t i = 0; i < n; i++) {
        shim_device *d = devices[i];
        if (!same_runtime(d, rt))
            continue;
        for (unsigned k = 0, ns = shard_count(d); k < ns; k++) {
            shim_shard *s = d->shards[k];
            bool taken = lock_with_frees_finished(d, s);
            int rc = -2;
            bool here = shim_arena_contains(s->arena, info.base);
            if (here) {
                /* Still the block asked about (a free may have raced). */
                shim_live_fields f = {0};
                uintptr_t start;
                rc = shim_arena_live_block_at(s->arena, info.base, &start) && start == info.base &&
                             shim_table_find_fields(s->table, start, &f) != SHIM_TABLE_NONE
                         ? (shim_arena_export(s->arena, start) ? 0 : -1)
                         : -2;
            }
            if (taken)
                shim_lock_release(&s->lock);
            if (here) {
                if (rc == 0)
                    *base = info.base;
                return rc;
            }
        }
    }
    return -2;
}
