/* The launcher's identity of this process (rank.h): which worker of a
 * multi-process job it is, from the variables torchrun, Open MPI, MPICH's
 * PMI and Slurm set for their workers, so that output paths (%r, %l, %R,
 * %h in path.c) and the trace and report (their process records) can say
 * which rank wrote them.
 *
 * Owns a copy of those values, taken once under pthread_once (from the
 * constructor: a program that later calls setenv() changes nothing, and no
 * thread ever reads the environment while the program writes it). Read-only
 * afterwards. A value is kept only when it is a decimal number (ranks,
 * sizes, counts) or, for the run id, printable text without a path
 * separator: a value goes into file names. */
#include "rank.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* In order of precedence: the first variable set wins. */
static const struct source {
    size_t offset;
    bool number;
    const char *vars[5];
} sources[] = {
    {offsetof(shim_rank, rank), true,
     {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL}},
    {offsetof(shim_rank, local_rank), true,
     {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL}},
    {offsetof(shim_rank, world_size), true,
     {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL}},
    {offsetof(shim_rank, restart), true, {"TORCHELASTIC_RESTART_COUNT", NULL}},
    {offsetof(shim_rank, run_id), false, {"TORCHELASTIC_RUN_ID", NULL}},
};

#define FIELD_MAX 64
static char values[sizeof sources / sizeof sources[0]][FIELD_MAX];
static char host[256];
static shim_rank ident;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static bool acceptable(const char *v, bool number)
{
    size_t n = strlen(v);
    if (n == 0 || n >= FIELD_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)v[i];
        if (number ? (c < '0' || c > '9') : (c <= ' ' || c >= 0x7f || c == '/'))
            return false;
    }
    return true;
}

static void read_env(void)
{
    for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
        const struct source *s = &sources[i];
        for (const char *const *v = s->vars; *v; v++) {
            const char *val = getenv(*v);
            if (!val || !acceptable(val, s->number))
                continue;
            strcpy(values[i], val);
            *(const char **)((char *)&ident + s->offset) = values[i];
            break;
        }
    }
    if (gethostname(host, sizeof host - 1) != 0)
        host[0] = '\0';
    /* A name of our own making never has a separator. */
    for (char *c = host; *c; c++)
        if (*c == '/')
            *c = '_';
    ident.host = host;
}

const shim_rank *shim_rank_get(void)
{
    pthread_once(&once, read_env);
    return &ident;
}
