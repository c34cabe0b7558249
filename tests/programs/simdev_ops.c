/* A program that uses the simulated device the way an application would,
 * driven by its arguments, for the integration tests (run with and without
 * LD_PRELOAD=libspyreshim.so). Each argument is one operation:
 *   a:SIZE   allocate SIZE bytes (K/M/G suffixes), fill with a tag, keep it
 *   f        free the newest kept block
 *   F        free every kept block, checking each block's contents first
 *   d        free the last freed pointer again (a double free)
 *   i        print "info FREE TOTAL"
 *   fill:SIZE  allocate SIZE blocks until out of memory, print "filled N"
 *   fork     in a child: allocate, write, check, free; print "child ok"
 * Prints one line per operation: "<op> rc=<error>" plus details. Exits 0
 * unless a block's contents were corrupted (exit 3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simdev.h"

static size_t parse_size(const char *s)
{
    char *end;
    size_t v = strtoull(s, &end, 10);
    switch (*end) {
    case 'K': v <<= 10; break;
    case 'M': v <<= 20; break;
    case 'G': v <<= 30; break;
    default: break;
    }
    return v;
}

#define MAXB 100000
static void *blocks[MAXB];
static size_t sizes[MAXB];
static size_t nb;

static int verify(void *p, size_t size, unsigned char tag)
{
    size_t n = size < 65536 ? size : 65536;
    unsigned char *buf = malloc(n);
    int ok = simdevMemcpy(buf, p, n, simdevMemcpyDeviceToHost) == 0;
    for (size_t i = 0; ok && i < n; i++)
        ok = buf[i] == tag;
    free(buf);
    return ok;
}

int main(int argc, char **argv)
{
    void *last_freed = NULL;
    int corrupt = 0;
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
        if (!strncmp(op, "a:", 2)) {
            size_t sz = parse_size(op + 2);
            void *p = NULL;
            int rc = simdevMalloc(&p, sz);
            if (rc == 0 && p && nb < MAXB) {
                simdevMemset(p, (int)(nb % 251) + 1, sz < 65536 ? sz : 65536);
                blocks[nb] = p;
                sizes[nb++] = sz;
            }
            printf("alloc %zu rc=%d\n", sz, rc);
        } else if (!strcmp(op, "f")) {
            int rc = nb ? simdevFree(blocks[--nb]) : -1;
            last_freed = nb < MAXB ? blocks[nb] : NULL;
            printf("free rc=%d\n", rc);
        } else if (!strcmp(op, "F")) {
            while (nb) {
                nb--;
                if (!verify(blocks[nb], sizes[nb], (unsigned char)(nb % 251) + 1))
                    corrupt = 1;
                last_freed = blocks[nb];
                if (simdevFree(blocks[nb]) != 0)
                    corrupt = 1;
            }
            printf("freeall corrupt=%d\n", corrupt);
        } else if (!strcmp(op, "d")) {
            printf("doublefree rc=%d\n", simdevFree(last_freed));
        } else if (!strcmp(op, "i")) {
            size_t f = 0, t = 0;
            int rc = simdevMemGetInfo(&f, &t);
            printf("info rc=%d free=%zu total=%zu\n", rc, f, t);
        } else if (!strncmp(op, "fill:", 5)) {
            size_t sz = parse_size(op + 5), n = 0;
            void *p;
            int rc;
            while ((rc = simdevMalloc(&p, sz)) == 0 && nb < MAXB) {
                simdevMemset(p, (int)(nb % 251) + 1, sz < 65536 ? sz : 65536);
                blocks[nb] = p;
                sizes[nb++] = sz;
                n++;
            }
            printf("filled %zu rc=%d\n", n, rc);
        } else if (!strcmp(op, "fork")) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                void *p;
                int ok = simdevMalloc(&p, 1 << 20) == 0 && simdevMemset(p, 7, 1 << 20) == 0 &&
                         verify(p, 1 << 20, 7) && simdevFree(p) == 0;
                printf("child %s\n", ok ? "ok" : "failed");
                fflush(stdout);
                _exit(ok ? 0 : 1);
            }
            int st;
            waitpid(pid, &st, 0);
            printf("fork status=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
        } else {
            fprintf(stderr, "simdev_ops: unknown operation %s\n", op);
            return 2;
        }
    }
    return corrupt ? 3 : 0;
}
