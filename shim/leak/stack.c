/* Native stack capture and interning.
 *
 * Owns the privately loaded libunwind and the table of interned stacks
 * (frame array -> 32-bit id). Capture runs on the allocating thread with no
 * allocator lock held. Looking up a stack seen before is lock-free; adding a
 * new one takes `g_lock`, a mutex of this file alone that never nests with
 * any other lock (the allocator lock in particular is never held here).
 *
 * libunwind is never linked and never loaded into the global scope: it
 * exports _Unwind_RaiseException, `backtrace` and friends, and would take
 * over the C++ exceptions (and glibc backtraces) of every library in the
 * process. dlopen(RTLD_LOCAL) keeps its symbols visible to us alone.
 *
 * Unwinding walks the loaded objects (libunwind calls dl_iterate_phdr and
 * takes locks of its own): every unw_backtrace runs inside the fork gate
 * (forkgate.h), so that a fork never leaves a child holding those locks,
 * and is never called with a shim lock held (leak.c does not capture then).
 *
 * Interned stacks are never freed: ids stay valid for the life of the
 * process, so records and reports can hold them without reference counts.
 * Memory is bounded by the number of distinct stacks, not allocations.
 * Locks, their order and fork: docs/locking.md.
 */
#include "stack.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hashidx.h"
#include "forkgate.h"
#include "loader.h"
#include "log.h"
#include "mutex.h"

typedef int (*unw_backtrace_fn)(void **buffer, int size);

static unw_backtrace_fn g_backtrace;
static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;

/* The text of the object the shim lives in: leading frames inside it are
 * the shim's own and are dropped. Unset (0, 0) when the shim is linked into
 * the main program (unit tests): then only capture's own frame is dropped. */
static uintptr_t g_self_lo, g_self_hi;

/* ---- interned stacks ---------------------------------------------------- */

typedef struct stack_entry {
    uint64_t hash;
    uint32_t n;
    const uintptr_t *frames;
} stack_entry;

#define CHUNK_BITS 12u
#define CHUNK_SIZE (1u << CHUNK_BITS)
#define MAX_CHUNKS 4096u                      /* 16M distinct stacks */

/* id -> entry: fixed directory of chunks that never move, so a reader holding
 * an id never races with growth. A chunk is published before any id in it. */
static _Atomic(stack_entry *) g_chunks[MAX_CHUNKS];
static _Atomic uint32_t g_count;              /* ids 1..g_count exist */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static bool g_full_warned;

/* Frame storage: bump allocation from large blocks, never freed. */
#define POOL_BLOCK (64u * 1024u)
static uintptr_t *g_pool;
static size_t g_pool_left;                    /* in frames */

/* On the hot path for every allocation: four independent lanes so the
 * multiplies overlap (a single dependent chain costs ~4 cycles a frame). */
static uint64_t hash_frames(const uintptr_t *f, size_t n)
{
    const uint64_t k = 0xff51afd7ed558ccdull;
    uint64_t h0 = n, h1 = 0x9e3779b97f4a7c15ull, h2 = 0xc2b2ae3d27d4eb4full, h3 = 0x165667b19e3779f9ull;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h0 = (h0 ^ f[i]) * k;
        h1 = (h1 ^ f[i + 1]) * k;
        h2 = (h2 ^ f[i + 2]) * k;
        h3 = (h3 ^ f[i + 3]) * k;
    }
    for (; i < n; i++)
        h0 = (h0 ^ f[i]) * k;
    uint64_t h = h0 ^ (h1 >> 17 | h1 << 47) ^ (h2 >> 31 | h2 << 33) ^ (h3 >> 45 | h3 << 19);
    h ^= h >> 29;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    return h;
}

static stack_entry *entry_of(uint32_t id)
{
    uint32_t i = id - 1;
    stack_entry *chunk = atomic_load_explicit(&g_chunks[i >> CHUNK_BITS], memory_order_acquire);
    return chunk ? &chunk[i & (CHUNK_SIZE - 1)] : NULL;
}

typedef struct frames_key {
    const uintptr_t *f;
    size_t n;
} frames_key;

static bool entry_eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    (void)ctx;
    const stack_entry *e = entry_of(id);
    const frames_key *k = key;
    return e->hash == hash && e->n == k->n && memcmp(e->frames, k->f, k->n * sizeof *k->f) == 0;
}

static uint64_t entry_hash(const void *ctx, uint32_t id)
{
    (void)ctx;
    return entry_of(id)->hash;
}

/* hash -> id: the shared index (hashidx.h) in lock-free mode: captures
 * look stacks up without g_lock; a miss is confirmed under it (a reader
 * may have probed a superseded table). */
static shim_hashidx g_index = SHIM_HASHIDX_INIT(entry_hash, entry_eq, NULL, SHIM_HASHIDX_LOCKFREE);

static uint32_t index_find(uint64_t hash, const uintptr_t *f, size_t n)
{
    frames_key k = { f, n };
    return shim_hashidx_find(&g_index, hash, &k);
}

static const uintptr_t *pool_copy(const uintptr_t *f, size_t n)
{
    if (g_pool_left < n) {
        size_t frames = POOL_BLOCK / sizeof(uintptr_t);
        g_pool = malloc(frames * sizeof(uintptr_t));
        if (!g_pool) {
            g_pool_left = 0;
            return NULL;
        }
        g_pool_left = frames;
    }
    uintptr_t *dst = g_pool;
    memcpy(dst, f, n * sizeof *f);
    g_pool += n;
    g_pool_left -= n;
    return dst;
}

static uint32_t intern_locked(uint64_t hash, const uintptr_t *f, size_t n)
{
    uint32_t id = index_find(hash, f, n);
    if (id)
        return id;
    uint32_t count = atomic_load_explicit(&g_count, memory_order_relaxed);
    if (count >= MAX_CHUNKS * CHUNK_SIZE) {
        if (!g_full_warned)
            shim_warn("stack table full (%u stacks): new stacks are not recorded", count);
        g_full_warned = true;
        return 0;
    }
    uint32_t i = count;                        /* id - 1 of the new stack */
    stack_entry *chunk = atomic_load_explicit(&g_chunks[i >> CHUNK_BITS], memory_order_relaxed);
    if (!chunk) {
        chunk = calloc(CHUNK_SIZE, sizeof *chunk);
        if (!chunk)
            return 0;
        atomic_store_explicit(&g_chunks[i >> CHUNK_BITS], chunk, memory_order_release);
    }
    const uintptr_t *copy = pool_copy(f, n);
    if (!copy || !shim_hashidx_reserve(&g_index, 1))
        return 0;
    stack_entry *e = &chunk[i & (CHUNK_SIZE - 1)];
    e->hash = hash;
    e->n = (uint32_t)n;
    e->frames = copy;
    id = count + 1;
    atomic_store_explicit(&g_count, id, memory_order_release);
    shim_hashidx_insert(&g_index, hash, id);
    return id;
}

/* The stack this thread interned last: a loop that allocates from one
 * call site (most of them) is matched by one compare against that entry,
 * without the hash and the index probe. Entries never change once
 * published, so reading one needs no lock. */
static __thread uint32_t tls_last_id __attribute__((tls_model("initial-exec")));

uint32_t shim_stack_intern(const uintptr_t *frames, size_t n)
{
    if (n == 0)
        return 0;
    if (n > SHIM_STACK_MAX_DEPTH)
        n = SHIM_STACK_MAX_DEPTH;
    uint32_t last = tls_last_id;
    if (last) {
        const stack_entry *e = entry_of(last);
        if (e->n == n && memcmp(e->frames, frames, n * sizeof *frames) == 0)
            return last;
    }
    uint64_t hash = hash_frames(frames, n);
    uint32_t id = index_find(hash, frames, n);
    if (!id) {
        shim_mutex_lock(&g_lock);
        id = intern_locked(hash, frames, n);
        shim_mutex_unlock(&g_lock);
    }
    tls_last_id = id;
    return id;
}

size_t shim_stack_frames(uint32_t id, const uintptr_t **frames)
{
    if (id == 0 || id > atomic_load_explicit(&g_count, memory_order_acquire))
        return 0;
    const stack_entry *e = entry_of(id);
    *frames = e->frames;
    return e->n;
}

size_t shim_stack_count(void)
{
    return atomic_load_explicit(&g_count, memory_order_acquire);
}

void shim_stack_atfork_prepare(void) { shim_mutex_lock(&g_lock); }
void shim_stack_atfork_parent(void) { shim_mutex_unlock(&g_lock); }
void shim_stack_atfork_child(void) { shim_mutex_unlock(&g_lock); }

/* ---- capture ------------------------------------------------------------ */

/* Frames the shim itself may put above its caller (capture, leak hook,
 * device layer, runtime hook, a trampoline or two). */
#define OWN_FRAMES_MAX 12

static int find_self(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t me = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (me >= lo && me < hi) {
            /* The main program reports an empty name: the shim is linked
             * into a test, whose own frames must stay. */
            if (info->dlpi_name && info->dlpi_name[0]) {
                g_self_lo = lo;
                g_self_hi = hi;
            }
            return 1;
        }
    }
    return 0;
}

static void init_once(void)
{
    /* RTLD_LOCAL: see the comment at the top. RTLD_NOW: fail here, not on
     * the first allocation. */
    void *h = shim_dlopen("libunwind.so.8", RTLD_LOCAL | RTLD_NOW);
    if (!h) {
        /* The wheel carries its own (RUNPATH $ORIGIN/_libs, docs/install.md);
         * a plain install uses the system's: say which package brings it. */
        shim_warn("leak check: cannot load libunwind.so.8 (%s): no native stacks, Python frames "
                  "only (install libunwind: Debian/Ubuntu libunwind8, Fedora libunwind)",
                  shim_dlerror());
        return;
    }
    g_backtrace = (unw_backtrace_fn)shim_dlsym(h, "unw_backtrace");
    if (!g_backtrace) {
        shim_warn("leak check: libunwind.so.8 has no unw_backtrace: no native stacks");
        return;
    }
    shim_dl_iterate_phdr(find_self, (void *)(uintptr_t)&shim_stack_capture);
    /* No warm-up unwind here: libunwind's first unwind opens a pipe (its
     * memory validation, x86_64 Ginit.c) that would then sit at fds 3 and 4
     * of every leak-checked process, /bin/true included, breaking programs
     * that hand out or close descriptors by number (CPython's pass_fds).
     * The program's first capture pays that first unwind (milliseconds,
     * once) in a process that does use a device. */
}

bool shim_stack_init(void)
{
    pthread_once(&g_init_once, init_once);
    return g_backtrace != NULL;
}

/* How many leading frames are the shim's own: learned from the captures
 * (the path through the hooks is fixed), so that the unwinder walks no
 * further than the frames that are kept. */
static atomic_uint g_own = 3;

static int count_own(void *const *buf, int n)
{
    int skip = 0;
    if (g_self_hi) {
        while (skip < n && (uintptr_t)buf[skip] >= g_self_lo && (uintptr_t)buf[skip] < g_self_hi)
            skip++;
    } else if (n > 0) {
        skip = 1;                              /* this function */
    }
    return skip;
}

__attribute__((noinline))
uint32_t shim_stack_capture(unsigned max_depth)
{
    unw_backtrace_fn bt = g_backtrace;
    if (!bt || max_depth == 0)
        return 0;
    if (max_depth > SHIM_STACK_MAX_DEPTH)
        max_depth = SHIM_STACK_MAX_DEPTH;
    void *buf[SHIM_STACK_MAX_DEPTH + OWN_FRAMES_MAX];
    unsigned own = atomic_load_explicit(&g_own, memory_order_relaxed);
    if (own > OWN_FRAMES_MAX)
        own = OWN_FRAMES_MAX;
    int want = (int)(max_depth + own);
    shim_fork_gate_enter();
    int n = bt(buf, want);
    int skip = count_own(buf, n);
    /* A path with more frames of ours than assumed: remember, and when the
     * walk stopped short of the kept frames, walk again (a bounded number
     * of times: each round learns at least one more frame). */
    while ((unsigned)skip > own && skip < OWN_FRAMES_MAX) {
        own = (unsigned)skip;
        atomic_store_explicit(&g_own, own, memory_order_relaxed);
        if (n < want)
            break;                             /* the whole stack was walked */
        want = (int)(max_depth + own);
        n = bt(buf, want);
        skip = count_own(buf, n);
    }
    shim_fork_gate_leave();
    size_t keep = n > skip ? (size_t)(n - skip) : 0;
    if (keep > max_depth)
        keep = max_depth;
    return shim_stack_intern((const uintptr_t *)(buf + skip), keep);
}
