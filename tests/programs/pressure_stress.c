/* Threads allocating, checking and freeing device memory under constant
 * pressure, with a framework-style cache: blocks a thread is done with are
 * parked in a cache (its own mutex) instead of freed, and the pressure
 * callback empties it. That is the design note's lock order in C: the
 * callback releases the allocator lock, takes the cache lock, and frees
 * (allocator lock again) while holding it; threads take the cache lock
 * without the allocator lock. Run under ThreadSanitizer with
 * detect_deadlocks=1 by scripts/tsan_gc.sh, and plainly by the tests.
 *   pressure_stress THREADS ITERATIONS
 * Prints "stress ok=N oom=N corrupt=N callbacks=N"; exits 0 when nothing
 * was corrupted and the callback ran. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simdev.h"
#include "spyreshim.h"

#define LIVE 8
#define CACHE_MAX 256

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static void *cache[CACHE_MAX];
static size_t ncache;
static _Atomic unsigned long n_ok, n_oom, n_corrupt, n_callbacks;
/* The shim's API, looked up in the preloaded library (not linked). */
static void (*lock_release)(spyreshim_lock *);
static void (*lock_acquire)(spyreshim_lock *);

static void release_to_device(void *p)
{
    if (simdevFree(p) != 0)
        atomic_fetch_add(&n_corrupt, 1);
}

/* Parks a block; a full cache frees the oldest itself. */
static void park(void *p)
{
    void *evict = NULL;
    pthread_mutex_lock(&cache_mu);
    if (ncache == CACHE_MAX) {
        evict = cache[0];
        memmove(cache, cache + 1, (CACHE_MAX - 1) * sizeof cache[0]);
        ncache--;
    }
    cache[ncache++] = p;
    pthread_mutex_unlock(&cache_mu);
    if (evict)
        release_to_device(evict);
}

static void empty_cache(spyreshim_lock *lock, size_t want, void *user)
{
    (void)want, (void)user;
    atomic_fetch_add(&n_callbacks, 1);
    lock_release(lock);
    pthread_mutex_lock(&cache_mu);
    while (ncache)
        release_to_device(cache[--ncache]);
    pthread_mutex_unlock(&cache_mu);
    lock_acquire(lock);
}

static int check(void *p, size_t n, unsigned char tag)
{
    unsigned char buf[4096];
    size_t k = n < sizeof buf ? n : sizeof buf;
    if (simdevMemcpy(buf, p, k, simdevMemcpyDeviceToHost) != 0)
        return 0;
    for (size_t i = 0; i < k; i++)
        if (buf[i] != tag)
            return 0;
    return 1;
}

struct worker { unsigned seed, iters; };

static void *work(void *arg)
{
    struct worker *w = arg;
    void *ptr[LIVE] = {0};
    size_t size[LIVE] = {0};
    unsigned char tag[LIVE] = {0};
    for (unsigned it = 0; it < w->iters; it++) {
        int i = (int)(rand_r(&w->seed) % LIVE);
        if (ptr[i]) {
            if (!check(ptr[i], size[i], tag[i]))
                atomic_fetch_add(&n_corrupt, 1);
            park(ptr[i]);
            ptr[i] = NULL;
            continue;
        }
        size[i] = 4096 + (rand_r(&w->seed) % 512) * 4096;
        tag[i] = (unsigned char)(1 + rand_r(&w->seed) % 255);
        int rc = simdevMalloc(&ptr[i], size[i]);
        if (rc == simdevErrorMemoryAllocation) {
            atomic_fetch_add(&n_oom, 1);
            ptr[i] = NULL;
            continue;
        }
        if (rc != 0 || simdevMemset(ptr[i], tag[i], size[i] < 4096 ? size[i] : 4096) != 0) {
            atomic_fetch_add(&n_corrupt, 1);
            ptr[i] = NULL;
            continue;
        }
        atomic_fetch_add(&n_ok, 1);
    }
    for (int i = 0; i < LIVE; i++)
        if (ptr[i])
            release_to_device(ptr[i]);
    return NULL;
}

int main(int argc, char **argv)
{
    unsigned nthreads = argc > 1 ? (unsigned)atoi(argv[1]) : 4;
    unsigned iters = argc > 2 ? (unsigned)atoi(argv[2]) : 2000;
    if (nthreads < 1 || nthreads > 64) {
        fprintf(stderr, "pressure_stress: THREADS must be 1..64\n");
        return 2;
    }
    int (*reg)(spyreshim_pressure_fn, void *) =
        (int (*)(spyreshim_pressure_fn, void *))dlsym(RTLD_DEFAULT,
                                                     "spyreshim_register_pressure_callback");
    lock_release = (void (*)(spyreshim_lock *))dlsym(RTLD_DEFAULT, "spyreshim_lock_release");
    lock_acquire = (void (*)(spyreshim_lock *))dlsym(RTLD_DEFAULT, "spyreshim_lock_acquire");
    if (!reg || !lock_release || !lock_acquire || reg(empty_cache, NULL) != 0) {
        fprintf(stderr, "pressure_stress: run it with LD_PRELOAD=libspyreshim.so\n");
        return 2;
    }
    pthread_t t[64];
    struct worker w[64];
    for (unsigned i = 0; i < nthreads; i++) {
        w[i] = (struct worker){.seed = 12345u + i * 7919u, .iters = iters};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (unsigned i = 0; i < nthreads; i++)
        pthread_join(t[i], NULL);
    pthread_mutex_lock(&cache_mu);
    while (ncache)
        release_to_device(cache[--ncache]);
    pthread_mutex_unlock(&cache_mu);
    printf("stress ok=%lu oom=%lu corrupt=%lu callbacks=%lu\n", n_ok, n_oom, n_corrupt,
           n_callbacks);
    return n_corrupt == 0 && n_callbacks > 0 ? 0 : 1;
}
