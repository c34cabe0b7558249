/* The shared open-addressing index (shim/base/hashidx.c): ids keyed by a
 * hash with the caller's equality, growth keeping every id, colliding
 * hashes told apart, and lock-free readers racing a writer that grows it.
 * SEED=n replays the randomized test. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "hashidx.h"

enum { N = 100000 };
static uint64_t keys[N + 1];   /* id -> key; published before the id */

static uint64_t mix(uint64_t k)
{
    k *= 0x9e3779b97f4a7c15ull;
    return k ^ (k >> 31);
}

static bool eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    (void)ctx, (void)hash;
    return __atomic_load_n(&keys[id], __ATOMIC_RELAXED) == *(const uint64_t *)key;
}

static uint64_t hash_of(const void *ctx, uint32_t id)
{
    (void)ctx;
    return mix(keys[id]);
}

/* A hash that puts every key in a handful of homes: equality decides. */
static uint64_t bad_hash_of(const void *ctx, uint32_t id)
{
    (void)ctx;
    return keys[id] % 3;
}

Test(hashidx, finds_every_id_after_growing_from_empty)
{
    shim_hashidx x = SHIM_HASHIDX_INIT(hash_of, eq, NULL, false);
    uint64_t missing = 12345678;
    cr_assert_eq(shim_hashidx_find(&x, mix(missing), &missing), 0);
    for (uint32_t id = 1; id <= N; id++) {
        keys[id] = (uint64_t)id * 7919 + 1;
        cr_assert(shim_hashidx_reserve(&x, 1));
        shim_hashidx_insert(&x, mix(keys[id]), id);
    }
    cr_assert_eq(shim_hashidx_count(&x), N);
    for (uint32_t id = 1; id <= N; id++)
        cr_assert_eq(shim_hashidx_find(&x, mix(keys[id]), &keys[id]), id, "id %u", id);
    uint64_t absent = 2;
    cr_assert_eq(shim_hashidx_find(&x, mix(absent), &absent), 0);
    shim_hashidx_destroy(&x);
}

Test(hashidx, colliding_hashes_are_told_apart_by_equality)
{
    shim_hashidx x = SHIM_HASHIDX_INIT(bad_hash_of, eq, NULL, false);
    for (uint32_t id = 1; id <= 2000; id++) {
        keys[id] = id * 3 + (id % 3);
        cr_assert(shim_hashidx_reserve(&x, 1));
        shim_hashidx_insert(&x, keys[id] % 3, id);
    }
    for (uint32_t id = 1; id <= 2000; id++)
        cr_assert_eq(shim_hashidx_find(&x, keys[id] % 3, &keys[id]), id);
    shim_hashidx_destroy(&x);
}

static shim_hashidx shared = SHIM_HASHIDX_INIT(hash_of, eq, NULL, SHIM_HASHIDX_LOCKFREE);
static _Atomic uint32_t published;

static void *reader(void *arg)
{
    uint64_t s = (uint64_t)(uintptr_t)arg;
    unsigned misses = 0;
    for (unsigned i = 0; i < 400000; i++) {
        uint32_t have = atomic_load_explicit(&published, memory_order_acquire);
        if (!have)
            continue;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t id = (uint32_t)(s >> 33) % have + 1;
        uint64_t k = keys[id];
        uint32_t got = shim_hashidx_find(&shared, mix(k), &k);
        /* A miss is allowed only in a superseded table (then the caller
         * looks again under the lock); a wrong id never. */
        cr_assert(got == 0 || got == id, "found %u for %u", got, id);
        misses += got == 0;
    }
    return (void *)(uintptr_t)misses;
}

/* Readers without a lock while the writer inserts and grows the index. */
Test(hashidx, lock_free_readers_never_see_a_wrong_id)
{
    const char *env = getenv("SEED");
    uint64_t seed = env && *env ? strtoull(env, NULL, 0) : 0x4a54;
    fprintf(stderr, "hashidx readers: SEED=%" PRIu64 "\n", seed);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&th[i], NULL, reader, (void *)(uintptr_t)(seed + (uint64_t)i));
    for (uint32_t id = 1; id <= N; id++) {
        keys[id] = mix(seed + id) | 1;
        cr_assert(shim_hashidx_reserve(&shared, 1));
        shim_hashidx_insert(&shared, mix(keys[id]), id);
        atomic_store_explicit(&published, id, memory_order_release);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (uint32_t id = 1; id <= N; id++)
        cr_assert_eq(shim_hashidx_find(&shared, mix(keys[id]), &keys[id]), id);
    shim_hashidx_destroy(&shared);
}
