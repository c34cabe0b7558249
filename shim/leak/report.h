/* Grouping of live allocations by stack, and their text and JSON forms.
 * See report.c. */
#ifndef SHIM_REPORT_H
#define SHIM_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "spyreshim.h"
#include "suppress.h"

typedef struct shim_report_frame {
    bool python;
    const char *function;    /* NULL when unknown; C++ names demangled */
    const char *raw;         /* native frames: the mangled name `function` came from, or NULL */
    const char *file;        /* NULL when unknown */
    const char *object;      /* native frames: the mapped object */
    int line;                /* 0 when unknown */
    uintptr_t address;       /* native frames: the return address */
    uintptr_t offset;        /* native frames: address - object base */
    bool interpreter;        /* native frame in the object that holds the interpreter */
    bool folded;             /* hidden in the default view (interpreter internals) */
    /* A native call of the evaluation loop (_PyEval_EvalFrameDefault) in a
     * spliced stack: the number of Python frames it ran, which are the ones
     * right before it; -1 for every other frame. */
    int python_frames;
} shim_report_frame;

/* How a group's frames are ordered (docs/python-stacks.md, "Hybrid stacks"). */
enum shim_report_order {
    SHIM_ORDER_NATIVE,       /* native frames only */
    SHIM_ORDER_PYTHON,       /* Python frames only */
    SHIM_ORDER_HYBRID,       /* true call order: Python frames where the interpreter ran them */
    SHIM_ORDER_PYTHON_FIRST, /* not spliced (see `unspliced`): Python frames, then native */
    SHIM_ORDER_ORIGIN,       /* native frames of a thread without Python, then the Python
                              * stack that started the work (origin.c) */
};

typedef struct shim_report_group {
    uint64_t bytes, count;
    const char *runtime;
    uint32_t python_stack, native_stack;
    int suppression;         /* index of the matching pattern, -1: none */
    shim_report_frame *frames;  /* innermost first, in `order` */
    size_t nframes;
    enum shim_report_order order;
    const char *unspliced;   /* SHIM_ORDER_PYTHON_FIRST: why (static string) */
    size_t nfolded;
    /* Its stack was printed earlier in this exit's output (the
     * out-of-memory report): the text gives its first frame only
     * (shim_report_mark_printed). */
    bool printed_before;
} shim_report_group;

/* A group's key (runtime, stacks), kept to find it in another report. */
typedef struct shim_report_key {
    char runtime[32];
    uint32_t python_stack, native_stack;
} shim_report_key;

typedef struct shim_report shim_report;

/* Groups `n` allocations by (runtime, Python stack, native stack), largest
 * first, resolves their frames and applies `sup` (may be NULL). NULL only
 * when out of host memory. */
shim_report *shim_report_build(const spyreshim_alloc_info *allocs, size_t n,
                               const shim_suppressions *sup);
/* The same, naming the frames with `like`'s symbolizer (may be NULL: its
 * own): two reports of one moment (the exit's leaks and what Python held)
 * resolve the same addresses once, in one libdw session (a second session
 * in the process left static functions unnamed in some runs). Freed
 * before `like`. */
shim_report *shim_report_build_like(const spyreshim_alloc_info *allocs, size_t n,
                                    const shim_suppressions *sup, const shim_report *like);
void shim_report_free(shim_report *r);
/* The keys of the first `max_groups` unsuppressed groups with a stack (0:
 * all), the ones shim_report_print shows, into `out` (room for `n`);
 * returns how many. */
size_t shim_report_printed_keys(const shim_report *r, size_t max_groups, shim_report_key *out,
                                size_t n);
/* Marks the groups of `r` whose key is among `keys` as printed before. */
void shim_report_mark_printed(shim_report *r, const shim_report_key *keys, size_t n);
size_t shim_report_ngroups(const shim_report *r);
const shim_report_group *shim_report_group_at(const shim_report *r, size_t i);
/* Totals over unsuppressed and suppressed groups. */
void shim_report_totals(const shim_report *r, uint64_t *live_bytes, uint64_t *live_allocs,
                        uint64_t *suppressed_bytes, uint64_t *suppressed_allocs);

enum shim_report_kind {
    SHIM_REPORT_LEAKS,       /* at exit: "Leak of ..." */
    SHIM_REPORT_LIVE,        /* on OOM and for snapshots: "Live: ..." */
    SHIM_REPORT_HELD,        /* at exit: what Python held as it began to shut down */
};
/* LeakSanitizer-style text of the unsuppressed groups, at most `max_groups`
 * of them (0: all), under `headline`. Returns 0 or -1 (errno set). */
int shim_report_print(const shim_report *r, int fd, enum shim_report_kind kind,
                      const char *headline, size_t max_groups);
/* The JSON of docs/report-format.md. Returns 0 or -1 (errno set). */
int shim_report_write_json(const shim_report *r, FILE *f, const char *reason);
/* The same, with more top-level members: `members` (NULL: none) is JSON
 * text the caller made, `"key": value` pairs separated by commas (the
 * out-of-memory verdict's object, the collections section). */
int shim_report_write_json_extra(const shim_report *r, FILE *f, const char *reason,
                                 const char *members);
/* {"bytes", "allocations", "suppressed_bytes", "suppressed_allocations",
 * "groups"} of `r` as JSON text (malloc'd; NULL when out of memory): a
 * section of another report (its "held_until_exit"). */
char *shim_report_groups_json(const shim_report *r);

/* One site's "runtime", "order" and "frames" members on one line (the
 * collections section, shim/leak/collections.c); `g` NULL: no frames. */
void shim_report_json_site(FILE *f, const shim_report_group *g, const char *runtime);

#endif
