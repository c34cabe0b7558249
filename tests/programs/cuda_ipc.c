/* IPC across two real processes on the CUDA stand-in driver, with or
 * without the shim preloaded (tests/integration/test_cuda_ipc.py).
 *
 *   cuda_ipc PATTERN          the exporter: allocates, writes, exports, and
 *                             runs "cuda_ipc peer IN OUT" (fork + exec,
 *                             so the peer is a process of its own with
 *                             the same environment), sending it handles
 *                             over a pipe and waiting for its answer to
 *                             each before going on.
 *
 * PATTERN:
 *   nccl       NCCL's legacy transport: a 4 MiB buffer (NCCL_BUFFSIZE's
 *              default) from cuMemAlloc_v2, cuIpcGetMemHandle on it, the
 *              peer opens it with CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS and
 *              reads it; the peer writes, the exporter reads the peer's
 *              bytes
 *   offset     Mooncake #1622: six tensors of 64 B .. 4 MiB carved from
 *              two segments the way a caching allocator does (2 MiB small
 *              segment, 20 MiB large one); for each, base from
 *              cuMemGetAddressRange_v2(ptr), export base, send ptr - base;
 *              the peer opens, adds the offset, reads
 *   direct     the same six sizes, each its own cuMemAlloc_v2: a block the
 *              shim carved out of a shared region is refused (printed
 *              "refused SIZE rc=N"), the others are read by the peer
 *   torch      torch.multiprocessing: a 20 MiB segment, a storage inside
 *              it at an offset; cudaIpcGetMemHandle of the segment's base
 *              through the runtime (which reaches the driver through
 *              cuGetProcAddress), the peer's cudaIpcOpenMemHandle, offset,
 *              read, cudaIpcCloseMemHandle
 *   neighbour  a peer cannot read a neighbouring block: blocks A (4 MiB)
 *              and B (4 MiB), C (64 KiB) and D (64 KiB) allocated in
 *              turn, B and D filled with a marker; A is exported, the
 *              peer's range is A's size exactly, holds none of B's bytes,
 *              and a read one byte past its end fails; C is exported if
 *              the driver (or the shim) lets it, and then the same holds
 *   reuse      the exporter frees an exported block while the peer has it
 *              open and allocates the same size again with other bytes:
 *              the peer still reads the old bytes, never the new owner's
 *   freed      (the stand-in alone) a handle whose allocation was freed
 *              before the peer opened it is refused
 *   keep       exports a 4 MiB block, the peer reads it, and the exporter
 *              exits without freeing it (a leak for the leak check)
 *   caller     a 64 KiB block allocated by libipccaller.so (a library that
 *              exports, as libnccl does) next to one of the program's own:
 *              exported (the peer reads it) when SPYRESHIM_CUDA_IPC_CALLERS
 *              names the library, else refused like any small block
 *   limit      4 MiB blocks (regions of their own) until one fails: under
 *              SPYRESHIM_LIMIT, with out-of-memory (2)
 *   gone       (the stand-in alone) the exporter exits; the peer's open of
 *              its handle afterwards is refused (CUDA_ERROR_MAP_FAILED)
 *
 * Prints one line per check; exits 0 when every check passed. */
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cudadrv.h"

#define MIB ((size_t)1 << 20)
#define LAZY 1u

static int failures;

#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond)) {                                         \
            fprintf(stderr, "%s FAIL: ", who);                 \
            fprintf(stderr, __VA_ARGS__);                      \
            fprintf(stderr, "\n");                             \
            failures++;                                        \
        }                                                      \
    } while (0)

static const char *who = "exporter";

/* What the exporter asks of the peer. */
enum op { OP_END, OP_READ, OP_READ_RUNTIME, OP_NEIGHBOUR, OP_WRITE, OP_OPEN_FAILS, OP_KEEP_OPEN,
          OP_REREAD_CLOSE, OP_HOLD };

struct msg {
    int op;
    unsigned seed;            /* the bytes: pattern(seed) */
    unsigned marker;          /* OP_NEIGHBOUR: the neighbour's seed */
    int want_rc;              /* OP_OPEN_FAILS */
    unsigned long long offset, size, range;
    CUipcMemHandle h;
};

/* A hash of (seed, i): different seeds give unrelated bytes everywhere. */
static unsigned char pattern(unsigned seed, size_t i)
{
    uint32_t x = seed * 0x9e3779b1u ^ (uint32_t)i * 0x85ebca6bu ^ (uint32_t)(i >> 32);
    x ^= x >> 15;
    x *= 0xc2b2ae35u;
    x ^= x >> 13;
    return (unsigned char)x;
}

static void fill(unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = pattern(seed, i);
}

static size_t mismatches(const unsigned char *buf, size_t n, unsigned seed)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += buf[i] != pattern(seed, i);
    return bad;
}

static void write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0) {
            fprintf(stderr, "%s: write: %s\n", who, strerror(errno));
            exit(2);
        }
        c += k;
        n -= (size_t)k;
    }
}

static bool read_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        ssize_t k = read(fd, c, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

static void context(void)
{
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) {
        fprintf(stderr, "%s: no context\n", who);
        exit(2);
    }
}

/* Writes pattern(seed) to [p, p+n). */
static void put(CUdeviceptr p, size_t n, unsigned seed)
{
    unsigned char *buf = malloc(n);
    fill(buf, n, seed);
    CUresult rc = cuMemcpyHtoD_v2(p, buf, n);
    CHECK(rc == CUDA_SUCCESS, "write %zu bytes: %d", n, rc);
    free(buf);
}

/* ---- the runtime's IPC (the stand-in libcudart, through the driver) -- */

typedef struct { char reserved[64]; } cudaIpcMemHandle_t;
static int (*rt_get)(cudaIpcMemHandle_t *, void *);
static int (*rt_open)(void **, cudaIpcMemHandle_t, unsigned);
static int (*rt_close)(void *);

static void runtime(void)
{
    if (rt_get)
        return;
    void *h = dlopen("libcudart_standin.so", RTLD_NOW);
    if (!h) {
        fprintf(stderr, "%s: %s\n", who, dlerror());
        exit(2);
    }
    *(void **)&rt_get = dlsym(h, "cudaIpcGetMemHandle");
    *(void **)&rt_open = dlsym(h, "cudaIpcOpenMemHandle");
    *(void **)&rt_close = dlsym(h, "cudaIpcCloseMemHandle");
}

/* ---- the peer ----------------------------------------------------------- */

static CUdeviceptr kept;   /* OP_KEEP_OPEN's mapping */
static unsigned long long kept_size;

static CUdeviceptr open_handle(const struct msg *m, bool rt, CUresult *rc)
{
    if (rt) {
        runtime();
        void *p = NULL;
        cudaIpcMemHandle_t h;
        memcpy(&h, &m->h, sizeof h);
        *rc = (CUresult)rt_open(&p, h, LAZY);
        return (uintptr_t)p;
    }
    CUdeviceptr p = 0;
    *rc = cuIpcOpenMemHandle_v2(&p, m->h, LAZY);
    return p;
}

static void peer_read(const struct msg *m, bool rt)
{
    CUresult rc;
    CUdeviceptr p = open_handle(m, rt, &rc);
    CHECK(rc == CUDA_SUCCESS, "open (%s): %d", rt ? "runtime" : "driver", rc);
    if (rc)
        return;
    CUdeviceptr base;
    size_t range;
    rc = cuMemGetAddressRange_v2(&base, &range, p);
    CHECK(rc == CUDA_SUCCESS && base == p, "range of the opened handle: %d", rc);
    /* The exporter's range, or under the shim that rounded up to the
     * shim's 256-byte alignment: a region of its own holds the block
     * rounded, and that slack is the block's, nobody else's. */
    CHECK(m->range == 0 || range == m->range ||
              (range > m->range && range - m->range < 256 && range % 256 == 0),
          "opened range %zu bytes, the exporter's %llu", range, m->range);
    unsigned char *buf = malloc(m->size);
    rc = cuMemcpyDtoH_v2(buf, p + m->offset, m->size);
    CHECK(rc == CUDA_SUCCESS, "read %llu bytes at +%llu: %d", m->size, m->offset, rc);
    size_t bad = rc ? m->size : mismatches(buf, m->size, m->seed);
    CHECK(bad == 0, "%zu of %llu bytes at +%llu differ", bad, m->size, m->offset);
    printf("peer read %llu at +%llu: %s\n", m->size, m->offset, bad ? "wrong" : "ok");
    /* Opened again in this context: the same address, one more close. */
    CUresult rc2;
    CUdeviceptr again = open_handle(m, rt, &rc2);
    CHECK(rc2 == CUDA_SUCCESS && again == p, "second open: %d, %#llx (first %#llx)", rc2, again, p);
    rc = rt ? (CUresult)rt_close((void *)(uintptr_t)p) : cuIpcCloseMemHandle(p);
    CHECK(rc == CUDA_SUCCESS, "close: %d", rc);
    CHECK(cuMemcpyDtoH_v2(buf, p, 1) == CUDA_SUCCESS, "still mapped after one of two closes");
    rc = rt ? (CUresult)rt_close((void *)(uintptr_t)p) : cuIpcCloseMemHandle(p);
    CHECK(rc == CUDA_SUCCESS, "close: %d", rc);
    CHECK(cuMemcpyDtoH_v2(buf, p, 1) != CUDA_SUCCESS, "readable after the last close");
    free(buf);
}

/* The whole range the handle maps: A's bytes, none of the neighbour's,
 * and nothing past its end. */
static void peer_neighbour(const struct msg *m)
{
    CUresult rc;
    CUdeviceptr p = open_handle(m, false, &rc);
    CHECK(rc == CUDA_SUCCESS, "open: %d", rc);
    if (rc)
        return;
    CUdeviceptr base;
    size_t range = 0;
    rc = cuMemGetAddressRange_v2(&base, &range, p);
    CHECK(rc == CUDA_SUCCESS && base == p && range == m->size,
          "the opened range is %zu bytes, the exported block %llu", range, m->size);
    unsigned char *buf = malloc(range);
    rc = cuMemcpyDtoH_v2(buf, p, range);
    CHECK(rc == CUDA_SUCCESS, "read the whole range: %d", rc);
    size_t bad = mismatches(buf, m->size < range ? m->size : range, m->seed);
    /* The neighbour's bytes, 64 in a row, anywhere in the range. */
    unsigned char probe[64];
    fill(probe, sizeof probe, m->marker);
    bool seen = false;
    for (size_t i = 0; i + sizeof probe <= range && !seen; i += 256)
        seen = memcmp(buf + i, probe, sizeof probe) == 0;
    CHECK(!seen, "the neighbour's bytes are readable through the handle");
    CHECK(bad == 0, "%zu bytes of the exported block differ", bad);
    unsigned char one;
    rc = cuMemcpyDtoH_v2(&one, p + range, 1);
    CHECK(rc != CUDA_SUCCESS, "a read past the opened range succeeded");
    printf("peer neighbour %llu: range %zu, neighbour %s, past the end %s\n", m->size, range,
           seen ? "READABLE" : "unreadable", rc ? "refused" : "READ");
    free(buf);
    CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS, "close");
}

static void peer_write(const struct msg *m)
{
    CUresult rc;
    CUdeviceptr p = open_handle(m, false, &rc);
    CHECK(rc == CUDA_SUCCESS, "open: %d", rc);
    if (rc)
        return;
    put(p + m->offset, m->size, m->seed);
    CHECK(cuIpcCloseMemHandle(p) == CUDA_SUCCESS, "close");
    printf("peer wrote %llu\n", m->size);
}

static int peer(int in, int out)
{
    who = "peer";
    context();
    struct msg m, held = {.op = OP_END};
    bool ended = false;
    while ((ended = read_all(in, &m, sizeof m)) && m.op != OP_END) {
        switch (m.op) {
        case OP_HOLD:
            held = m;
            break;
        case OP_READ:
            peer_read(&m, false);
            break;
        case OP_READ_RUNTIME:
            peer_read(&m, true);
            break;
        case OP_NEIGHBOUR:
            peer_neighbour(&m);
            break;
        case OP_WRITE:
            peer_write(&m);
            break;
        case OP_OPEN_FAILS: {
            CUdeviceptr p;
            CUresult rc = cuIpcOpenMemHandle_v2(&p, m.h, 0);
            CHECK(rc == (CUresult)m.want_rc, "open of a freed allocation: %d, want %d", rc,
                  m.want_rc);
            printf("peer open of a freed allocation: %d\n", rc);
            break;
        }
        case OP_KEEP_OPEN: {
            CUresult rc;
            kept = open_handle(&m, false, &rc);
            kept_size = m.size;
            CHECK(rc == CUDA_SUCCESS, "open: %d", rc);
            break;
        }
        case OP_REREAD_CLOSE: {
            unsigned char *buf = malloc(kept_size);
            CUresult rc = cuMemcpyDtoH_v2(buf, kept, kept_size);
            CHECK(rc == CUDA_SUCCESS, "read the kept mapping: %d", rc);
            size_t old = rc ? kept_size : mismatches(buf, kept_size, m.seed);
            bool new_owner = rc == 0 && mismatches(buf, kept_size, m.marker) == 0;
            CHECK(old == 0, "after the exporter's free: %zu bytes are not the old ones%s", old,
                  new_owner ? " (they are the new owner's)" : "");
            printf("peer after the exporter's free: %s\n",
                   new_owner ? "NEW OWNER'S BYTES" : old ? "changed" : "old bytes");
            free(buf);
            CHECK(cuIpcCloseMemHandle(kept) == CUDA_SUCCESS, "close the kept mapping");
            break;
        }
        }
        char ack = failures ? 'F' : 'k';
        write_all(out, &ack, 1);
    }
    if (!ended && held.op == OP_HOLD) {
        /* The exporter is gone (the pipe's end): its handle cannot map. */
        CUdeviceptr p;
        CUresult rc = cuIpcOpenMemHandle_v2(&p, held.h, 0);
        CHECK(rc == CUDA_ERROR_MAP_FAILED, "open after the exporter exited: %d", rc);
        printf("peer open after the exporter exited: %d\n", rc);
    }
    return failures ? 1 : 0;
}

/* ---- the exporter ------------------------------------------------------- */

static int to_peer = -1, from_peer = -1;
static pid_t peer_pid;

static void start_peer(const char *self)
{
    int down[2], up[2];
    if (pipe(down) || pipe(up)) {
        perror("pipe");
        exit(2);
    }
    peer_pid = fork();
    if (peer_pid == 0) {
        close(down[1]);
        close(up[0]);
        char in[16], out[16];
        snprintf(in, sizeof in, "%d", down[0]);
        snprintf(out, sizeof out, "%d", up[1]);
        execl(self, self, "peer", in, out, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    to_peer = down[1];
    from_peer = up[0];
}

/* Sends m and waits for the peer to have done it. */
static void ask(struct msg *m)
{
    write_all(to_peer, m, sizeof *m);
    char ack;
    CHECK(read_all(from_peer, &ack, 1), "the peer is gone");
}

static int finish(void)
{
    struct msg end = {.op = OP_END};
    write_all(to_peer, &end, sizeof end);
    int st = 0;
    waitpid(peer_pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the peer failed (status %#x)", st);
    printf("%s\n", failures ? "FAILED" : "all ok");
    return failures ? 1 : 0;
}

static CUdeviceptr alloc(size_t n)
{
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc_v2(&p, n);
    if (rc) {
        fprintf(stderr, "exporter: cuMemAlloc_v2(%zu): %d\n", n, rc);
        exit(2);
    }
    return p;
}

/* Exports `ptr` and asks the peer `op` on [offset, offset+size). */
static CUresult share(int op, CUdeviceptr ptr, unsigned long long offset, unsigned long long size,
                      unsigned seed, unsigned long long range)
{
    struct msg m = {.op = op, .seed = seed, .offset = offset, .size = size, .range = range};
    CUresult rc = cuIpcGetMemHandle(&m.h, ptr);
    if (rc)
        return rc;
    ask(&m);
    return CUDA_SUCCESS;
}

static void nccl(void)
{
    size_t n = 4 * MIB;
    CUdeviceptr buf = alloc(n);
    put(buf, n, 11);
    CUresult rc = share(OP_READ, buf, 0, n, 11, n);
    CHECK(rc == CUDA_SUCCESS, "cuIpcGetMemHandle of the buffer: %d", rc);
    /* The other direction: the peer writes into the exporter's buffer. */
    struct msg m = {.op = OP_WRITE, .seed = 12, .offset = 4096, .size = 65536};
    CHECK(cuIpcGetMemHandle(&m.h, buf) == CUDA_SUCCESS, "handle");
    ask(&m);
    unsigned char *back = malloc(65536);
    CHECK(cuMemcpyDtoH_v2(back, buf + 4096, 65536) == CUDA_SUCCESS, "read back");
    size_t bad = mismatches(back, 65536, 12);
    CHECK(bad == 0, "%zu of the peer's bytes differ", bad);
    printf("exporter read the peer's bytes: %s\n", bad ? "wrong" : "ok");
    free(back);
    CHECK(cuMemFree_v2(buf) == CUDA_SUCCESS, "free");
}

static const size_t six[] = {64, 4096, 65536, 1 << 20, 2 << 20, 4 << 20};

static void offset(void)
{
    /* A caching allocator's segments: up to 1 MiB from 2 MiB ones, larger
     * from 20 MiB ones (PyTorch's kSmallBuffer, kLargeBuffer). */
    CUdeviceptr small = alloc(2 * MIB), large = alloc(20 * MIB);
    size_t small_at = 512, large_at = 3 * MIB;
    for (unsigned k = 0; k < 6; k++) {
        bool big = six[k] > MIB;
        CUdeviceptr t = big ? large + large_at : small + small_at;
        if (big)
            large_at += six[k] + 512;
        else
            small_at += (six[k] + 511) / 512 * 512 + 512;
        put(t, six[k], 100 + k);
        CUdeviceptr base;
        size_t range;
        CUresult rc = cuMemGetAddressRange_v2(&base, &range, t);
        CHECK(rc == CUDA_SUCCESS && base == (big ? large : small), "range of tensor %u: %d", k, rc);
        rc = share(OP_READ, base, t - base, six[k], 100 + k, range);
        CHECK(rc == CUDA_SUCCESS, "cuIpcGetMemHandle of the segment of tensor %u: %d", k, rc);
    }
    CHECK(cuMemFree_v2(small) == CUDA_SUCCESS && cuMemFree_v2(large) == CUDA_SUCCESS, "free");
}

static void direct(void)
{
    CUdeviceptr t[6];
    for (unsigned k = 0; k < 6; k++) {
        t[k] = alloc(six[k]);
        put(t[k], six[k], 200 + k);
    }
    for (unsigned k = 0; k < 6; k++) {
        CUdeviceptr base;
        size_t range;
        CHECK(cuMemGetAddressRange_v2(&base, &range, t[k]) == CUDA_SUCCESS, "range");
        CUresult rc = share(OP_READ, base, t[k] - base, six[k], 200 + k, range);
        if (rc)
            printf("refused %zu rc=%d\n", six[k], rc);
        else
            printf("exported %zu\n", six[k]);
    }
    for (unsigned k = 0; k < 6; k++)
        CHECK(cuMemFree_v2(t[k]) == CUDA_SUCCESS, "free");
}

static void torch(void)
{
    runtime();
    CUdeviceptr segment = alloc(20 * MIB);
    size_t storage = 3 * MIB + 512, n = MIB;
    put(segment + storage, n, 31);
    struct msg m = {.op = OP_READ_RUNTIME, .seed = 31, .offset = storage, .size = n,
                    .range = 20 * MIB};
    cudaIpcMemHandle_t h;
    int rc = rt_get(&h, (void *)(uintptr_t)segment);
    CHECK(rc == 0, "cudaIpcGetMemHandle of the segment: %d", rc);
    if (rc == 0) {
        memcpy(&m.h, &h, sizeof h);
        ask(&m);
    }
    CHECK(cuMemFree_v2(segment) == CUDA_SUCCESS, "free");
    /* Through the runtime too, a block that shares its region is not
     * exported: the runtime's call reached the shim's cuIpcGetMemHandle. */
    CUdeviceptr small = alloc(65536), next = alloc(65536);
    rc = rt_get(&h, (void *)(uintptr_t)small);
    printf("runtime export of a 64 KiB block: rc=%d\n", rc);
    CHECK(cuMemFree_v2(small) == CUDA_SUCCESS && cuMemFree_v2(next) == CUDA_SUCCESS, "free");
}

static void neighbour(void)
{
    CUdeviceptr a = alloc(4 * MIB), b = alloc(4 * MIB), c = alloc(65536), d = alloc(65536);
    put(a, 4 * MIB, 41);
    put(b, 4 * MIB, 42);
    put(c, 65536, 43);
    put(d, 65536, 44);
    struct msg m = {.op = OP_NEIGHBOUR, .seed = 41, .marker = 42, .size = 4 * MIB};
    CUresult rc = cuIpcGetMemHandle(&m.h, a);
    CHECK(rc == CUDA_SUCCESS, "cuIpcGetMemHandle of A: %d", rc);
    if (rc == CUDA_SUCCESS)
        ask(&m);
    m = (struct msg){.op = OP_NEIGHBOUR, .seed = 43, .marker = 44, .size = 65536};
    rc = cuIpcGetMemHandle(&m.h, c);
    if (rc == CUDA_SUCCESS) {
        printf("exported C\n");
        ask(&m);
    } else {
        printf("refused C rc=%d\n", rc);
    }
    CUdeviceptr all[] = {a, b, c, d};
    for (unsigned k = 0; k < 4; k++)
        CHECK(cuMemFree_v2(all[k]) == CUDA_SUCCESS, "free");
}

static void reuse(void)
{
    size_t n = 4 * MIB;
    CUdeviceptr a = alloc(n);
    put(a, n, 51);
    struct msg m = {.op = OP_KEEP_OPEN, .size = n};
    CHECK(cuIpcGetMemHandle(&m.h, a) == CUDA_SUCCESS, "handle");
    ask(&m);
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS, "free while the peer has it open");
    CUdeviceptr a2 = alloc(n);
    put(a2, n, 52);
    printf("exporter: the new block is %s\n", a2 == a ? "at the same address" : "elsewhere");
    m = (struct msg){.op = OP_REREAD_CLOSE, .seed = 51, .marker = 52};
    ask(&m);
    CHECK(cuMemFree_v2(a2) == CUDA_SUCCESS, "free");
}

static void freed(void)
{
    CUdeviceptr a = alloc(4 * MIB);
    struct msg m = {.op = OP_OPEN_FAILS, .want_rc = CUDA_ERROR_INVALID_HANDLE};
    CHECK(cuIpcGetMemHandle(&m.h, a) == CUDA_SUCCESS, "handle");
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS, "free");
    ask(&m);
}

static void caller(void)
{
    void *lib = dlopen("libipccaller.so", RTLD_NOW);
    CUresult (*lib_alloc)(CUdeviceptr *, size_t) =
        lib ? (CUresult(*)(CUdeviceptr *, size_t))dlsym(lib, "ipc_caller_alloc") : NULL;
    if (!lib_alloc) {
        fprintf(stderr, "exporter: no libipccaller.so\n");
        exit(2);
    }
    CUdeviceptr mine = alloc(65536), theirs = 0;
    CHECK(lib_alloc(&theirs, 65536) == CUDA_SUCCESS, "the library's allocation");
    put(mine, 65536, 71);
    put(theirs, 65536, 72);
    struct msg m = {.op = OP_NEIGHBOUR, .seed = 72, .marker = 71, .size = 65536};
    CUresult rc = cuIpcGetMemHandle(&m.h, theirs);
    printf("the library's block: %s rc=%d\n", rc ? "refused" : "exported", rc);
    if (rc == CUDA_SUCCESS)
        ask(&m);
    CHECK(cuMemFree_v2(mine) == CUDA_SUCCESS && cuMemFree_v2(theirs) == CUDA_SUCCESS, "free");
}

/* Regions of their own are under the limit like any: 4 MiB blocks until
 * the driver's answer is not success. */
static void limit(void)
{
    CUdeviceptr p[8];
    CUresult rc = CUDA_SUCCESS;
    int n = 0;
    while (n < 8 && (rc = cuMemAlloc_v2(&p[n], 4 * MIB)) == CUDA_SUCCESS)
        n++;
    printf("4 MiB blocks: %d, then rc=%d\n", n, rc);
    while (n > 0)
        CHECK(cuMemFree_v2(p[--n]) == CUDA_SUCCESS, "free");
}

/* Exits without waiting for the peer, which then opens the handle. */
static void gone(void)
{
    CUdeviceptr a = alloc(4 * MIB);
    struct msg m = {.op = OP_HOLD};
    CHECK(cuIpcGetMemHandle(&m.h, a) == CUDA_SUCCESS, "handle");
    ask(&m);
    exit(failures ? 1 : 0);
}

static void keep(void)
{
    CUdeviceptr a = alloc(4 * MIB);
    put(a, 4 * MIB, 61);
    CHECK(share(OP_READ, a, 0, 4 * MIB, 61, 4 * MIB) == CUDA_SUCCESS, "handle");
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "peer") == 0)
        return peer(atoi(argv[2]), atoi(argv[3]));
    static const struct {
        const char *name;
        void (*run)(void);
    } patterns[] = {{"nccl", nccl}, {"offset", offset}, {"direct", direct}, {"torch", torch},
                    {"neighbour", neighbour}, {"reuse", reuse}, {"freed", freed},
                    {"keep", keep}, {"gone", gone}, {"caller", caller}, {"limit", limit}};
    for (size_t i = 0; argc == 2 && i < sizeof patterns / sizeof *patterns; i++) {
        if (strcmp(argv[1], patterns[i].name) == 0) {
            context();
            start_peer("/proc/self/exe");
            patterns[i].run();
            return finish();
        }
    }
    fprintf(stderr, "usage: cuda_ipc nccl|offset|direct|torch|neighbour|reuse|freed|keep|gone|caller|limit\n");
    return 2;
}
