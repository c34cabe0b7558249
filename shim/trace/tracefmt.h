/* The trace file's layout (docs/trace-format.md is its description; the
 * reader is spyreshim/reading/trace.py, a chunk's events
 * tracecodec.py). Little-endian, as written by the host. A file is a
 * header followed by chunks, one per flushed buffer; a chunk is complete
 * or it is the last one (a crash or SIGKILL cut it) and readers drop an
 * incomplete last chunk. Version 2's events are columns (below, encoded by
 * tracecodec.c); trace_event is what a thread appends, and version 1's
 * event on disk. */
#ifndef SHIM_TRACEFMT_H
#define SHIM_TRACEFMT_H

#include <stdint.h>

#define TRACE_MAGIC "SPYTRACE"
#define TRACE_VERSION 2           /* 1: 32-byte events; 2: columns (below) */
#define TRACE_CHUNK_MAGIC 0x4b4e4843u /* "CHNK" */

typedef struct trace_header {     /* 32 bytes */
    char magic[8];                /* TRACE_MAGIC */
    uint32_t version;             /* TRACE_VERSION */
    uint32_t pid;
    uint64_t start_realtime_ns;   /* CLOCK_REALTIME when recording began */
    uint64_t start_monotonic_ns;  /* event times are CLOCK_MONOTONIC minus this */
} trace_header;

typedef struct trace_chunk {      /* 32 bytes, then the events, then metadata */
    uint32_t magic;               /* TRACE_CHUNK_MAGIC */
    uint32_t nevents;             /* events that follow */
    uint32_t meta_bytes;          /* metadata records after the events */
    uint32_t body_bytes;          /* the encoded events (version 1: 0, they are 32 * nevents) */
    uint64_t seq_base;            /* the smallest sequence number of its events */
    uint32_t thread;              /* the recording thread's number in the process, from 1
                                     (0: a record of metadata only; version 1: 0) */
    uint32_t flags;               /* TRACE_CHUNK_* (version 1: 0) */
} trace_chunk;

/* Version 2's events: seven columns, in this order, each of `width` bytes
 * an event, little-endian, split into byte planes (plane b: byte b of
 * every event's value). The body is a table, for each column a mask of
 * the planes stored (bit b) and the byte of each plane (width bytes; the
 * value of every event where the plane is not stored, 0 where it is),
 * then the stored planes, column by column, plane 0 first, nevents bytes
 * each. TRACE_CHUNK_ZLIB: that body is one zlib stream. */
#define TRACE_CHUNK_ZLIB 1u
#define TRACE_V2_MAX_EVENTS 65536u /* in one chunk (the writer's hold 8192) */
#define TRACE_V2_COLUMNS(X)                                            \
    X(KIND, 1) /* enum trace_kind */                                   \
    X(DEV, 1)  /* the device index */                                  \
    X(SITE, 4)                                                         \
    X(SIZE, 8)                                                         \
    X(SEQ, 8)  /* whole sequence numbers */                            \
    X(TIME, 8) /* ns since the header's start_monotonic_ns */          \
    X(ADDR, 8)
#define TRACE_V2_TABLE_BYTES (7 + 1 + 1 + 4 + 8 + 8 + 8 + 8) /* 45 */
#define TRACE_V2_PLANES 38      /* the widths' sum: the most an event stores */

enum trace_kind {
    TRACE_ALLOC = 1,          /* addr, size, site */
    TRACE_FREE = 2,           /* addr, size of the block, site of its allocation */
    TRACE_OOM = 3,            /* a request of `size` bytes failed for good; addr = the
                                 runtime's free bytes then; site = the request's stacks */
    TRACE_PRESSURE_BEGIN = 4, /* size = the request that ran out */
    TRACE_PRESSURE_END = 5,   /* size = bytes freed during the event */
    TRACE_GC = 6,             /* size = bytes freed, addr = duration ns; time = its end */
    TRACE_SEGMENT_ALLOC = 7,  /* a region of `size` bytes at addr reserved from the runtime */
    TRACE_SEGMENT_FREE = 8,   /* that region given back (or forgotten at its context's end) */
    TRACE_POOL_TRIM = 9,      /* a stream-ordered pool trimmed: addr = the pool, size = bytes
                                 it gave back; device TRACE_DEVICE_ASYNC */
    TRACE_SHUTDOWN = 10,      /* the interpreter began to shut down (its atexit, before the
                                 leak check's collection); device TRACE_DEVICE_NONE */
};

typedef struct trace_event {  /* 32 bytes */
    uint64_t addr;
    uint64_t size_kind_dev;   /* size: bits 0-47, kind: 48-55, device: 56-63 */
    uint64_t time_ns;         /* since the header's start_monotonic_ns */
    uint32_t seq_lo;          /* sequence, low 32 bits: seq_base + (seq_lo - seq_base) mod 2^32 */
    uint32_t site;            /* (native stack, Python stack) pair; 0 = none */
} trace_event;

_Static_assert(sizeof(trace_header) == 32, "header layout");
_Static_assert(sizeof(trace_chunk) == 32, "chunk layout");
_Static_assert(sizeof(trace_event) == 32, "event layout");

#define TRACE_DEVICE_NONE 0xff  /* markers that belong to no one device */
/* Memory the shim passes through and watches, one pseudo-device per
 * family (named by a device record like the others): not device memory
 * the shim serves, so readers leave it out of the devices' peaks. */
#define TRACE_DEVICE_MANAGED 0xfd
#define TRACE_DEVICE_HOST_PINNED 0xfe
#define TRACE_DEVICE_VMM 0xfc
#define TRACE_DEVICE_ASYNC 0xfb /* stream-ordered allocations (cuda-async) */
/* OpenCL's memory objects (opencl) and SVM (opencl-svm) are traced on
 * their device (opencl:N); these only where the device was not known. */
#define TRACE_DEVICE_OPENCL_MEM 0xfa
#define TRACE_DEVICE_OPENCL_SVM 0xf9
#define TRACE_SIZE_MASK ((UINT64_C(1) << 48) - 1)

/* Metadata records: tag, payload length, payload padded to 8 bytes. */
typedef struct trace_meta {
    uint32_t tag;
    uint32_t len;
} trace_meta;

enum trace_tag {
    TRACE_META_SITE = 1,     /* u32 site, u32 native stack, u32 Python stack, u32 0 */
    TRACE_META_NSTACK = 2,   /* u32 id, u32 n, u64 return addresses[n] (innermost first) */
    TRACE_META_DEVICE = 3,   /* u32 index, u32 0, name (NUL-terminated) */
    TRACE_META_MAPS = 4,     /* the executable lines of /proc/self/maps, as text */
    TRACE_META_SYMBOL = 5,   /* u64 addr, i32 line, u32 flags, function\0 file\0 object\0 (at exit) */
    TRACE_META_PYSTACK = 6,  /* u32 id, u32 n, then n times: i32 line, function\0 file\0 (at exit) */
    TRACE_META_PYMARKS = 7,  /* u32 id, u32 SHIM_PYSTACK_* flags, u8 entry[n] (at exit, after 6) */
    TRACE_META_STATE = 8,    /* u32 TRACE_STATE_*, u32 value: recording (right after the
                                header), ended (the process's exit: the file's last record),
                                signalled (value: the signal whose default action ends it) */
    TRACE_META_PROCESS = 9,  /* key\0value\0 pairs: the launcher's identity (base/rank.h) */
    TRACE_META_CAPACITY = 10, /* u32 device index, u32 0, u64 bytes the program may have there */
};

/* A state record's state: a file that says "recording" and never "ended"
 * stopped before its process's exit (killed, _exit, exec, a write that
 * failed); a file with neither was written before they existed. */
#define TRACE_STATE_RECORDING 1u
#define TRACE_STATE_ENDED 2u
/* The process is ended by a signal's default action (value: the signal,
 * SIGTERM), after the flush the shim's handler asked for: the file's last
 * record. A reader that knows only 1 and 2 reads it as "recording". */
#define TRACE_STATE_SIGNALLED 3u

/* A symbol record's flags (0 in files written before they existed). */
#define TRACE_SYMBOL_EVAL_LOOP 1u    /* inside the interpreter's evaluation loop, by address */
#define TRACE_SYMBOL_INTERPRETER 2u  /* in the interpreter's own object (libpython, static exe) */

#endif
