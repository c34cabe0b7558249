/* The trace's sites (tracesites.h): (native stack, Python stack) pairs,
 * each interned once for the process, found again through the one index
 * (shim/base/hashidx.c).
 *
 * Owns the table of sites (sites[id - 1]) and its index. Guarded by
 * `site_mu`, the trace site lock: a leaf, taken by an appending thread
 * only for a pair its own cache does not have (tracebuf.c), possibly with
 * an allocator lock or the GIL held, and by the writer to copy the sites
 * that are new to the file. Never does I/O, never calls into the
 * allocator or Python. Insert-only: a site lives as long as the process
 * (a fork child keeps them). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hashidx.h"
#include "mutex.h"
#include "tracesites.h"

static pthread_mutex_t site_mu = PTHREAD_MUTEX_INITIALIZER;
static struct trace_site *sites;  /* sites[id - 1] */
static uint32_t nsites, sites_cap;

static uint64_t key_of(uint32_t nstack, uint32_t pystack)
{
    return (uint64_t)nstack << 32 | pystack;
}

static uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static uint64_t site_hash(const void *ctx, uint32_t id)
{
    (void)ctx;
    return mix(key_of(sites[id - 1].nstack, sites[id - 1].pystack));
}

static bool site_eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    (void)ctx;
    (void)hash;
    return key_of(sites[id - 1].nstack, sites[id - 1].pystack) == *(const uint64_t *)key;
}

/* Not lock-free: every lookup holds site_mu. */
static shim_hashidx index_ = SHIM_HASHIDX_INIT(site_hash, site_eq, NULL, false);

uint32_t shim_tracesites_intern(uint32_t nstack, uint32_t pystack)
{
    uint64_t key = key_of(nstack, pystack);
    if (!key)
        return 0;
    uint64_t h = mix(key);
    shim_mutex_lock(&site_mu);
    uint32_t id = shim_hashidx_find(&index_, h, &key);
    if (id)
        goto out;
    if (nsites == sites_cap) {
        uint32_t cap = sites_cap ? sites_cap * 2 : 1024;
        struct trace_site *s = realloc(sites, cap * sizeof *s);
        if (!s)
            goto out;
        sites = s;
        sites_cap = cap;
    }
    if (nsites == UINT32_MAX - 1 || !shim_hashidx_reserve(&index_, 1))
        goto out;
    sites[nsites] = (struct trace_site){nstack, pystack};
    id = ++nsites;
    shim_hashidx_insert(&index_, h, id);
out:
    shim_mutex_unlock(&site_mu);
    return id;
}

struct trace_site *shim_tracesites_since(uint32_t first, uint32_t *n)
{
    shim_mutex_lock(&site_mu);
    uint32_t count = nsites > first ? nsites - first : 0;
    struct trace_site *copy = count ? malloc(count * sizeof *copy) : NULL;
    if (copy)
        memcpy(copy, sites + first, count * sizeof *copy);
    shim_mutex_unlock(&site_mu);
    *n = copy ? count : 0;
    return copy;
}

void shim_tracesites_atfork_prepare(void) { shim_mutex_lock(&site_mu); }
void shim_tracesites_atfork_parent(void) { shim_mutex_unlock(&site_mu); }
void shim_tracesites_atfork_child(void) { shim_mutex_unlock(&site_mu); }
