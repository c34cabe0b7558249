/* Several threads allocating and freeing through the shim on the simulated
 * device, each block filled with its own byte and checked before it is
 * freed: two blocks handed out overlapping would corrupt each other. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device.h"

/* libsimdev's API (tests/simdev/simdev.h), declared by hand like the hooks. */
int simdevMalloc(void **ptr, size_t size);
int simdevFree(void *ptr);
int simdevMemGetInfo(size_t *free, size_t *total);
int simdevMemset(void *dst, int value, size_t count);
int simdevMemcpy(void *dst, const void *src, size_t count, int kind);

static shim_runtime simdev_rt = {
    .name = "simdev", .err_invalid = 1, .err_oom = 2, .alignment = 256,
    .real_malloc = simdevMalloc, .real_free = simdevFree, .real_mem_info = simdevMemGetInfo,
};

#define NTHREADS 4
#define ITERS 3000
#define LIVE 24
#define MAXSZ (64 * 1024)

static shim_device *dev;

struct worker { unsigned seed; int failures; };

static int check(void *p, size_t size, unsigned char tag, unsigned char *buf)
{
    if (simdevMemcpy(buf, p, size, 2) != 0)
        return 0;
    for (size_t i = 0; i < size; i++)
        if (buf[i] != tag)
            return 0;
    return 1;
}

static void *worker(void *arg)
{
    struct worker *w = arg;
    void *ptr[LIVE] = {0};
    size_t size[LIVE];
    unsigned char tag[LIVE];
    unsigned char *buf = malloc(MAXSZ);
    for (int it = 0; it < ITERS; it++) {
        int i = (int)(rand_r(&w->seed) % LIVE);
        if (ptr[i]) {
            if (!check(ptr[i], size[i], tag[i], buf))
                w->failures++;
            if (shim_device_free(dev, ptr[i]) != 0)
                w->failures++;
            ptr[i] = NULL;
        } else {
            size[i] = 1 + rand_r(&w->seed) % MAXSZ;
            tag[i] = (unsigned char)(1 + rand_r(&w->seed) % 255);
            if (shim_device_malloc(dev, &ptr[i], size[i]) != 0) {
                w->failures++;
                ptr[i] = NULL;
                continue;
            }
            if (simdevMemset(ptr[i], tag[i], size[i]) != 0)
                w->failures++;
        }
    }
    for (int i = 0; i < LIVE; i++) {
        if (ptr[i]) {
            if (!check(ptr[i], size[i], tag[i], buf))
                w->failures++;
            shim_device_free(dev, ptr[i]);
        }
    }
    free(buf);
    return NULL;
}

Test(threads, concurrent_blocks_never_overlap)
{
    dev = shim_device_get(&simdev_rt);
    cr_assert_not_null(dev);
    unsigned seed = (unsigned)time(NULL);
    const char *env = getenv("SEED");
    if (env)
        seed = (unsigned)strtoul(env, NULL, 10);
    cr_log_info("seed %u (set SEED to replay)", seed);
    pthread_t t[NTHREADS];
    struct worker w[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        w[i] = (struct worker){.seed = seed + (unsigned)i * 7919u};
        cr_assert_eq(pthread_create(&t[i], NULL, worker, &w[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(w[i].failures, 0, "thread %d saw %d corrupted or failed blocks (seed %u)",
                     i, w[i].failures, seed);
    }
    spyreshim_stats s = {.size = sizeof s};
    shim_device_add_stats(dev, &s);
    cr_assert_eq(s.used_bytes, 0);
    cr_assert_eq(s.allocs, s.frees);
    cr_assert_gt(s.allocs, 0);
}
