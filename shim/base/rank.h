/* Who launched this process as which worker: rank, local rank, world size,
 * restart count, run id and host, as launchers set them. See rank.c. */
#ifndef SHIM_RANK_H
#define SHIM_RANK_H

#include <stdbool.h>

/* A field a launcher did not set is NULL (text: "" where noted). */
typedef struct shim_rank {
    const char *rank;        /* RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID */
    const char *local_rank;  /* LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
                                SLURM_LOCALID */
    const char *world_size;  /* WORLD_SIZE, OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_NTASKS */
    const char *restart;     /* TORCHELASTIC_RESTART_COUNT */
    const char *run_id;      /* TORCHELASTIC_RUN_ID */
    const char *host;        /* gethostname(2); never NULL ("" when it failed) */
} shim_rank;

/* Read once (the constructor calls it first, before the program can change
 * its environment); the same answer afterwards, in forked children too. */
const shim_rank *shim_rank_get(void);

#endif
