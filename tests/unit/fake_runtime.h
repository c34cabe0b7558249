/* A fake runtime for unit tests of the device layer: hands out address
 * ranges of a pretend device with a fixed capacity and keeps the ranges it
 * has handed out, so tests can check what the shim reserved and returned.
 * Addresses are never dereferenced (there is nothing behind them). */
#ifndef FAKE_RUNTIME_H
#define FAKE_RUNTIME_H

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "device.h"

#define FAKE_BASE ((uintptr_t)0x7e0000000000ull)
#define FAKE_MAX_RANGES 4096

static struct {
    pthread_mutex_t mu;
    size_t capacity, used;
    uintptr_t next;
    struct { uintptr_t addr; size_t size; } ranges[FAKE_MAX_RANGES];
    size_t nranges;
    unsigned mallocs, frees, bad_frees;
} fake = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int fake_malloc(void **p, size_t size)
{
    pthread_mutex_lock(&fake.mu);
    int rc = 0;
    if (size == 0) {
        *p = NULL;
    } else if (fake.used + size > fake.capacity || fake.nranges == FAKE_MAX_RANGES) {
        rc = 2;
    } else {
        size_t sz = (size + 4095) & ~(size_t)4095;
        *p = (void *)fake.next;
        fake.ranges[fake.nranges].addr = fake.next;
        fake.ranges[fake.nranges].size = size;
        fake.nranges++;
        fake.next += sz + 4096;
        fake.used += size;
        fake.mallocs++;
    }
    pthread_mutex_unlock(&fake.mu);
    return rc;
}

static int fake_free(void *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock(&fake.mu);
    int rc = 1;
    for (size_t i = 0; i < fake.nranges; i++) {
        if (fake.ranges[i].addr == (uintptr_t)p) {
            fake.used -= fake.ranges[i].size;
            fake.ranges[i] = fake.ranges[--fake.nranges];
            fake.frees++;
            rc = 0;
            break;
        }
    }
    if (rc)
        fake.bad_frees++;
    pthread_mutex_unlock(&fake.mu);
    return rc;
}

static int fake_mem_info(size_t *f, size_t *t)
{
    pthread_mutex_lock(&fake.mu);
    *f = fake.capacity - fake.used;
    *t = fake.capacity;
    pthread_mutex_unlock(&fake.mu);
    return 0;
}

static shim_runtime fake_rt = {
    .name = "fake",
    .err_invalid = 1,
    .err_oom = 2,
    .alignment = 256,
    .real_malloc = fake_malloc,
    .real_free = fake_free,
    .real_mem_info = fake_mem_info,
};

/* Criterion runs each test in its own process, so every test starts with
 * no device; this sets the pretend capacity and creates it. */
static inline shim_device *fake_device(size_t capacity)
{
    fake.capacity = capacity;
    fake.used = 0;
    fake.next = FAKE_BASE;
    fake.nranges = 0;
    return shim_device_get(&fake_rt);
}

#endif
