/* options: the CUDASTANDIN_* variables, one table, read once by cuInit.
 *
 * No lock: cuInit reads them under its once-guard, and nothing changes
 * them afterwards. A bad value prints one warning naming the variable and
 * the default used; nothing aborts the test program. */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_DEVICES 2
#define DEFAULT_MEMORY ((size_t)1 << 30)

/* Bytes with an optional binary suffix K, M, G or T. Zero is refused: a
 * device without memory tests nothing. */
static bool parse_size(const char *s, const char **end_out, size_t *out)
{
    if (*s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || v == 0)
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (v > (unsigned long long)(SIZE_MAX >> shift))
        return false;
    *out = (size_t)v << shift;
    *end_out = end;
    return true;
}

static bool parse_devices(const char *s, struct cd_options *o)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < 1 || v > CD_MAX_DEVICES)
        return false;
    o->devices = (int)v;
    return true;
}

/* "1G" or "256M,1G": one capacity per device, the last one repeating. */
static bool parse_memory(const char *s, struct cd_options *o)
{
    size_t caps[CD_MAX_DEVICES];
    int n = 0;
    for (;;) {
        const char *end;
        if (n == CD_MAX_DEVICES || !parse_size(s, &end, &caps[n]))
            return false;
        n++;
        if (*end == '\0')
            break;
        if (*end != ',')
            return false;
        s = end + 1;
    }
    for (int i = 0; i < CD_MAX_DEVICES; i++)
        o->memory[i] = caps[i < n ? i : n - 1];
    return true;
}

static bool parse_delay(const char *s, struct cd_options *o)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || end == s || *s == '-' || v > 10u * 1000 * 1000)
        return false;
    o->op_delay_us = (unsigned)v;
    return true;
}

static const struct {
    const char *name;
    const char *fallback;   /* printed with the warning */
    bool (*parse)(const char *value, struct cd_options *o);
} table[] = {
    { "CUDASTANDIN_DEVICES", "2", parse_devices },
    { "CUDASTANDIN_MEMORY", "1G", parse_memory },
    { "CUDASTANDIN_OP_DELAY_US", "0", parse_delay },
};

/* CUDA_VISIBLE_DEVICES: the listed ordinals, in that order, up to the
 * first entry that is not a device (what the driver does). */
static void apply_visible(struct cd_options *o)
{
    const char *v = getenv("CUDA_VISIBLE_DEVICES");
    if (!v)
        return;
    size_t memory[CD_MAX_DEVICES];
    bool used[CD_MAX_DEVICES] = {false};
    int n = 0;
    const char *p = v;
    while (*p && n < CD_MAX_DEVICES) {
        char *end;
        long d = strtol(p, &end, 10);
        if (end == p || d < 0 || d >= o->devices || used[d])
            break;
        used[d] = true;
        memory[n++] = o->memory[d];
        p = end;
        if (*p != ',')
            break;
        p++;
    }
    for (int i = 0; i < n; i++)
        o->memory[i] = memory[i];
    o->devices = n;
}

void cd_options_read(struct cd_options *o)
{
    o->devices = DEFAULT_DEVICES;
    for (int i = 0; i < CD_MAX_DEVICES; i++)
        o->memory[i] = DEFAULT_MEMORY;
    o->op_delay_us = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const char *v = getenv(table[i].name);
        if (v && !table[i].parse(v, o))
            fprintf(stderr, "cudastandin: %s='%s' is not valid; using the default %s\n",
                    table[i].name, v, table[i].fallback);
    }
    apply_visible(o);
}
