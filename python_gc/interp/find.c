/* Locating the Python interpreter the process already embeds, without ever
 * loading one.
 *
 * Owns: the published scan result (an append-only array of shim_python
 * records; a record, once published, is never changed or freed, so callers
 * keep the pointer without a lock) and the loader counters of the last scan.
 * Guarded by find_mu, which is NEVER held across a call into the dynamic
 * loader (dl_iterate_phdr, dlopen): a library constructor that allocates
 * device memory can enter here with the loader's lock held, and a thread
 * holding find_mu while waiting for that lock would deadlock with it. Every
 * loader call goes through loader.h (checked: no shim lock held; inside the
 * fork gate).
 *
 * Steady state makes no walk: an interpreter once found stays (its handle
 * is kept, so it cannot be unloaded) and is returned as is. Without one,
 * "none as of loader counters (adds, subs)" is remembered; the counters are
 * read (one dl_iterate_phdr call stopped at its first object) on the
 * pressure path (shim_python_find_now), and on the allocation path only
 * after a hint that new code runs (shim_python_find_hint: leak checking
 * gives one for each new native stack), so that leak checking in a process
 * without Python pays nothing per allocation. A full scan runs only when
 * the counters moved.
 * Never dlopen()s anything that is not already loaded (RTLD_NOLOAD), never
 * RTLD_GLOBAL, never calls into Python except Py_GetVersion (a pure string
 * formatter, safe before initialization).
 * Locks, their order and fork: docs/locking.md. */
#include <elf.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "find.h"
#include "loader.h"
#include "log.h"
#include "mutex.h"

#define MAX_SEGMENTS 16
#define MAX_RECORDS 16
#define MAX_OBJECTS 1024

/* A published record: the public part first so that a shim_python pointer
 * converts back. */
typedef struct found {
    shim_python pub;
    int nseg;
    uintptr_t seg_lo[MAX_SEGMENTS], seg_hi[MAX_SEGMENTS];
} found;

static pthread_mutex_t find_mu = PTHREAD_MUTEX_INITIALIZER;
static found records[MAX_RECORDS];
static int nrecords;
static _Atomic(const found *) current;
/* Loader counters at the last completed scan; adds == 0 means "never". */
static _Atomic unsigned long long scanned_adds, scanned_subs;
/* Hints that new code runs (shim_python_find_hint): `hinted` once any came,
 * `hint_gen` counts them, `hint_seen` is hint_gen at the last counter read. */
static _Atomic bool hinted;
static _Atomic uint64_t hint_gen, hint_seen;

/* ---- the loader's view -------------------------------------------------- */

typedef struct object {
    char *name;               /* "" for the main program */
    int nseg;
    uintptr_t seg_lo[MAX_SEGMENTS], seg_hi[MAX_SEGMENTS];
} object;

typedef struct object_list {
    object *v;
    size_t n, cap;
    unsigned long long adds, subs;
} object_list;

static int counters_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    unsigned long long *c = data;
    if (size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
        c[0] = info->dlpi_adds;
        c[1] = info->dlpi_subs;
    } else {
        c[0] = c[1] = 0;
    }
    return 1; /* the first object is enough: the counters are global */
}

static int collect_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    object_list *l = data;
    if (l->n == 0 &&
        size >= offsetof(struct dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
        l->adds = info->dlpi_adds;
        l->subs = info->dlpi_subs;
    }
    if (l->n == l->cap) {
        if (l->cap >= MAX_OBJECTS)
            return 1;
        size_t cap = l->cap ? l->cap * 2 : 64;
        object *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return 1;
        l->v = v;
        l->cap = cap;
    }
    object *o = &l->v[l->n];
    memset(o, 0, sizeof *o);
    o->name = strdup(info->dlpi_name ? info->dlpi_name : "");
    if (!o->name)
        return 1;
    for (int i = 0; i < info->dlpi_phnum && o->nseg < MAX_SEGMENTS; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        o->seg_lo[o->nseg] = info->dlpi_addr + ph->p_vaddr;
        o->seg_hi[o->nseg] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        o->nseg++;
    }
    l->n++;
    return 0;
}

static bool in_segments(int nseg, const uintptr_t *lo, const uintptr_t *hi, const void *addr)
{
    uintptr_t a = (uintptr_t)addr;
    for (int i = 0; i < nseg; i++)
        if (a >= lo[i] && a < hi[i])
            return true;
    return false;
}

/* ---- identifying an interpreter ----------------------------------------- */

/* Looks `name` up through `handle` and keeps it only when the definition lies
 * in the object itself: a handle's scope includes its dependencies, and the
 * main program's handle is the whole global scope. Comparing dladdr()'s
 * dli_fbase with dlpi_addr would be wrong for non-PIE executables (whose
 * dlpi_addr is 0), so attribution goes by the PT_LOAD segments. */
static void *own_sym(void *handle, const object *o, const char *name)
{
    void *p = shim_dlsym(handle, name);
    if (p && !in_segments(o->nseg, o->seg_lo, o->seg_hi, p))
        return NULL;
    return p;
}

static void parse_version(const char *s, int *major, int *minor, int *micro)
{
    int a = 0, b = 0, c = 0;
    if (s && sscanf(s, "%d.%d.%d", &a, &b, &c) >= 2) {
        /* "3.9-c.so" stops after the minor: c stays 0. */
        *major = a;
        *minor = b;
        *micro = c;
    }
}

/* Fills `f` when object `o` (opened as `handle`) exports a Python C API. */
static bool identify(void *handle, const object *o, found *f)
{
    memset(f, 0, sizeof *f);
    if (own_sym(handle, o, "Py_IsInitialized")) {
        f->pub.kind = SHIM_PY_CPYTHON;
        const unsigned long *hex = own_sym(handle, o, "Py_Version"); /* 3.11+ */
        if (hex) {
            f->pub.major = (int)((*hex >> 24) & 0xff);
            f->pub.minor = (int)((*hex >> 16) & 0xff);
            f->pub.micro = (int)((*hex >> 8) & 0xff);
        } else {
            const char *(*get_version)(void) =
                (const char *(*)(void))own_sym(handle, o, "Py_GetVersion");
            if (get_version)
                parse_version(get_version(), &f->pub.major, &f->pub.minor, &f->pub.micro);
        }
        /* Only free-threaded builds define the shared-refcount slow path;
         * only Py_REF_DEBUG (debug) builds define the negative-refcount
         * reporter. */
        f->pub.free_threaded = own_sym(handle, o, "_Py_MergeZeroLocalRefcount") != NULL;
        f->pub.debug_build = own_sym(handle, o, "_Py_NegativeRefcount") != NULL;
    } else if (own_sym(handle, o, "PyPy_IsInitialized")) {
        f->pub.kind = SHIM_PY_PYPY;
        /* PyPy_GetVersion() crashes before the runtime is set up, and no
         * data symbol holds the version: the library is named after the
         * language version it implements ("libpypy3.9-c.so"). */
        const char *base = strrchr(o->name, '/');
        base = base ? base + 1 : o->name;
        f->pub.major = 3;
        if (strncmp(base, "libpypy", 7) == 0)
            parse_version(base + 7, &f->pub.major, &f->pub.minor, &f->pub.micro);
    } else {
        return false;
    }
    f->nseg = o->nseg;
    memcpy(f->seg_lo, o->seg_lo, sizeof f->seg_lo);
    memcpy(f->seg_hi, o->seg_hi, sizeof f->seg_hi);
    return true;
}

static bool usable_version(const found *f)
{
    if (f->pub.kind == SHIM_PY_PYPY)
        return f->pub.major >= 3;
    return f->pub.major == 3 && f->pub.minor >= 8;
}

/* One pass over the loaded objects. Runs without find_mu (see the top). */
static bool scan(found *out, unsigned long long *adds, unsigned long long *subs)
{
    object_list l = { 0 };
    shim_dl_iterate_phdr(collect_cb, &l);
    *adds = l.adds;
    *subs = l.subs;
    bool got = false;
    for (size_t i = 0; i < l.n && !got; i++) {
        object *o = &l.v[i];
        void *h = o->name[0] ? shim_dlopen_noload(o->name, RTLD_LAZY | RTLD_LOCAL)
                             : shim_dlopen(NULL, RTLD_LAZY); /* the main program: loads nothing */
        if (!h)
            continue;
        found f;
        if (identify(h, o, &f)) {
            if (!usable_version(&f)) {
                shim_warn("python_gc: %s: Python %d.%d is not supported (3.8+ or PyPy 3)",
                          o->name[0] ? o->name : "main program", f.pub.major, f.pub.minor);
            } else {
                *out = f;
                out->pub.handle = h; /* kept: the interpreter must not go away under us */
                if (o->name[0]) {
                    out->pub.path = o->name;
                    o->name = NULL;  /* ownership moves to the record */
                } else {
                    out->pub.path = strdup("main program");
                }
                if (!out->pub.path) {
                    shim_dlclose(h);
                    break;
                }
                got = true;
                continue;
            }
        }
        shim_dlclose(h);
    }
    for (size_t i = 0; i < l.n; i++)
        free(l.v[i].name);
    free(l.v);
    return got;
}

static bool same_object(const found *a, const found *b)
{
    return a->pub.kind == b->pub.kind && a->nseg == b->nseg && a->nseg > 0 &&
           a->seg_lo[0] == b->seg_lo[0] && strcmp(a->pub.path, b->pub.path) == 0;
}

void shim_python_find_hint(void)
{
    if (!atomic_load_explicit(&hinted, memory_order_relaxed))
        atomic_store(&hinted, true);
    atomic_fetch_add_explicit(&hint_gen, 1, memory_order_relaxed);
}

static const shim_python *find(bool now)
{
    const found *cur = atomic_load(&current);
    if (cur)
        return &cur->pub;       /* kept loaded by our handle: nothing to look for */
    /* A caller holding a lock of ours (a pressure callback allocating
     * before releasing the allocator lock) must not enter the loader. */
    if (shim_locks_held())
        return NULL;
    uint64_t h = atomic_load(&hint_gen);
    if (!now && atomic_load(&hinted) && atomic_load(&scanned_adds) != 0 &&
        h == atomic_load(&hint_seen))
        return NULL;            /* nothing new ran since the last look */
    atomic_store(&hint_seen, h);

    unsigned long long c[2] = { 0, 0 };
    shim_dl_iterate_phdr(counters_cb, c);
    if (c[0] != 0 && c[0] == atomic_load(&scanned_adds) && c[1] == atomic_load(&scanned_subs)) {
        const found *f = atomic_load(&current);
        return f ? &f->pub : NULL;
    }

    found f;
    unsigned long long adds, subs;
    bool got = scan(&f, &adds, &subs);

    shim_mutex_lock(&find_mu);
    cur = atomic_load(&current);
    const found *pub = NULL;
    if (got) {
        if (cur && same_object(cur, &f)) {
            pub = cur;
        } else if (nrecords < MAX_RECORDS) {
            records[nrecords] = f;
            pub = &records[nrecords++];
            shim_info("python_gc: found %s %d.%d.%d%s%s in %s",
                      f.pub.kind == SHIM_PY_PYPY ? "PyPy (Python" : "CPython",
                      f.pub.major, f.pub.minor, f.pub.micro,
                      f.pub.kind == SHIM_PY_PYPY ? ")" : "",
                      f.pub.free_threaded ? " (free-threaded)" :
                      f.pub.debug_build ? " (debug build)" : "", f.pub.path);
            f.pub.handle = NULL;
        } else {
            pub = cur; /* out of records: keep the last one (never seen in practice) */
        }
    }
    atomic_store(&current, pub);
    atomic_store(&scanned_subs, subs);
    atomic_store(&scanned_adds, adds);
    shim_mutex_unlock(&find_mu);

    if (got && f.pub.handle) {
        /* An equal record was already published; drop the extra reference. */
        shim_dlclose(f.pub.handle);
        free((char *)f.pub.path);
    }
    return pub ? &pub->pub : NULL;
}

const shim_python *shim_python_find(void)
{
    return find(false);
}

const shim_python *shim_python_find_now(void)
{
    return find(true);
}

void *shim_python_sym(const shim_python *py, const char *name)
{
    if (!py || !py->handle || !name)
        return NULL;
    const found *f = (const found *)py;
    void *p = shim_dlsym(py->handle, name);
    if (p && !in_segments(f->nseg, f->seg_lo, f->seg_hi, p))
        return NULL;
    return p;
}

void shim_python_find_atfork_child(void)
{
    pthread_mutex_init(&find_mu, NULL);
}
