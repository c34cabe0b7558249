/* Why an allocation failed for good: the facts gathered on the failure path
 * (alloc_path.c, arena_holes.c) and the verdict drawn from them (oomverdict.c). */
#ifndef SHIM_OOMVERDICT_H
#define SHIM_OOMVERDICT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct shim_oom_facts {
    uint64_t request;          /* bytes asked for */
    bool holes_known;          /* the arenas were walked (the device lock was held) */
    uint64_t largest_hole;     /* largest run inside one region that no live block holds */
    uint64_t free_in_regions;  /* all such bytes */
    uint64_t reserved;         /* bytes of the regions the shim holds */
    uint64_t used;             /* bytes of the blocks handed out */
    uint64_t limit;            /* SPYRESHIM_LIMIT for this device, 0 = none */
    bool device_known;         /* the runtime answered its memory query */
    uint64_t device_free, device_total; /* what the runtime says */
    bool collecting;           /* a collection run for pressure was still in flight */
    uint64_t collecting_ns;    /* how long it had run then */
    bool unreachable_known;    /* it has ended since (filled in later, at exit) */
    uint64_t unreachable;      /* bytes freed from the failure to its end: what the
                                  program no longer reached */
} shim_oom_facts;

enum shim_oom_kind {
    SHIM_OOM_FRAGMENTATION, /* free bytes would serve it, no hole is large enough */
    SHIM_OOM_EXHAUSTED,     /* the device is full of the program's live blocks */
    SHIM_OOM_LIMIT,         /* SPYRESHIM_LIMIT reached while the device had room */
    SHIM_OOM_FOREIGN,       /* the runtime's free is below what the shim accounts for */
    SHIM_OOM_COLLECTION,    /* a collection still running would have freed it */
};

/* The verdict, its name ("fragmentation", ...) in *name. */
enum shim_oom_kind shim_oom_verdict(const shim_oom_facts *f, const char **name);
/* One line (at most 300 characters, NUL included in cap) saying it, with
 * the figures that decided it. Returns the verdict's name. */
const char *shim_oom_verdict_line(const shim_oom_facts *f, const char *runtime, char *out,
                                  size_t cap);

#endif
