/* The shim's own descriptors (ownfd.c): kept above the numbers programs
 * get, and known by the file they name, so that a number the program
 * closed and reused is never read, written or accepted on. */
#ifndef SHIM_OWNFD_H
#define SHIM_OWNFD_H

#include <stdbool.h>
#include <sys/types.h>

struct shim_ownfd {
    int fd;       /* -1: none */
    dev_t dev;    /* what it named when taken */
    ino_t ino;
};

#define SHIM_OWNFD_NONE {-1, 0, 0}

/* Takes `fd` (close-on-exec from then on): moved to a high number when
 * one is free (the original closed), its file's identity recorded. -1
 * (errno set, fd closed) when fstat fails. */
int shim_ownfd_take(struct shim_ownfd *o, int fd);
/* Whether o->fd still names the file it was taken with: false once the
 * program closed it, reused its number (dup2, a new open) or never. */
bool shim_ownfd_is_ours(const struct shim_ownfd *o);
/* Closes o->fd when it is still ours (a reused number is the program's:
 * left alone); forgets it either way. */
void shim_ownfd_close(struct shim_ownfd *o);

#endif
