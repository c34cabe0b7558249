/* Report-time symbolization of native return addresses.
 *
 * Owns a per-report cache (address -> names) and the privately loaded
 * libdw. Runs only when a report is produced (exit, final OOM, snapshot
 * print/JSON), never on the allocation path; holds no lock of the shim and
 * needs none (a symbolizer belongs to the thread that created it).
 *
 * Why libdw (elfutils, dlopen'ed when present) rather than a batched
 * `addr2line` run: it works in-process, so a report at exit never forks and
 * execs from a library destructor (hazardous under seccomp, in setuid
 * programs, with a half-torn-down process), it reads each object's DWARF
 * once per report for all its addresses, finds separate debug files by
 * build-id (/usr/lib/debug/.build-id, locally only: no debuginfod network
 * lookups at exit), and gives function names from .symtab, which dladdr
 * cannot see (static functions, executables not linked with -rdynamic).
 * Without libdw (package libdw1) names fall back to dladdr: exported
 * symbols only, no file:line.
 *
 * The libdw prototypes are declared here (a handful, stable since elfutils
 * 0.122/0.130) so that building needs no libdw headers and the library
 * never links it.
 */
#include "symbolize.h"
#include "hashidx.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader.h"

/* ---- libdw, declared by hand ------------------------------------------- */

typedef struct Dwfl Dwfl;
typedef struct Dwfl_Module Dwfl_Module;
typedef struct Dwfl_Line Dwfl_Line;
typedef uint64_t Dwarf_Addr;
typedef uint64_t Dwarf_Word;
typedef void (*dw_any_fn)(void);
typedef struct Dwarf Dwarf;
typedef struct Dwarf_CU Dwarf_CU;
typedef struct Dwarf_Line_s Dwarf_Line;
/* libdw's Dwarf_Die: four words, passed by address only. */
typedef struct { void *w[4]; } Dwarf_Die;

typedef struct {
    dw_any_fn find_elf;
    dw_any_fn find_debuginfo;
    dw_any_fn section_address;
    char **debuginfo_path;
} Dwfl_Callbacks;

static struct {
    Dwfl *(*begin)(const Dwfl_Callbacks *);
    void (*end)(Dwfl *);
    void (*report_begin)(Dwfl *);
    int (*linux_proc_report)(Dwfl *, pid_t);
    int (*report_end)(Dwfl *, void *removed, void *arg);
    Dwfl_Module *(*addrmodule)(Dwfl *, Dwarf_Addr);
    const char *(*module_addrname)(Dwfl_Module *, Dwarf_Addr);
    Dwfl_Line *(*module_getsrc)(Dwfl_Module *, Dwarf_Addr);
    const char *(*lineinfo)(Dwfl_Line *, Dwarf_Addr *, int *, int *, Dwarf_Word *, Dwarf_Word *);
    /* For objects without .debug_aranges (clang's default), which libdw
     * before 0.189 cannot map to a CU: our own range index per module. */
    Dwarf *(*module_getdwarf)(Dwfl_Module *, Dwarf_Addr *bias);
    int (*get_units)(Dwarf *, Dwarf_CU *, Dwarf_CU **, void *version, void *unit_type,
                     Dwarf_Die *cudie, Dwarf_Die *subdie);
    ptrdiff_t (*ranges)(Dwarf_Die *, ptrdiff_t, Dwarf_Addr *, Dwarf_Addr *, Dwarf_Addr *);
    Dwarf_Line *(*getsrc_die)(Dwarf_Die *, Dwarf_Addr);
    const char *(*linesrc)(Dwarf_Line *, Dwarf_Word *, Dwarf_Word *);
    int (*lineno)(Dwarf_Line *, int *);
} dw;
static bool dw_units_ok;

static Dwfl_Callbacks dw_callbacks;
static bool dw_ok;
static pthread_once_t dw_once = PTHREAD_ONCE_INIT;

typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
/* The program's own C++ demangler, once found (see find_demangler). */
static _Atomic(demangle_fn) g_demangle;

#define DW_SYM(field, name)                                           \
    do {                                                              \
        *(void **)&dw.field = shim_dlsym(h, name);                    \
        if (!dw.field)                                                \
            return;                                                   \
    } while (0)

static void dw_load(void)
{
    void *h = shim_dlopen("libdw.so.1", RTLD_LOCAL | RTLD_NOW);
    if (!h)
        return;
    DW_SYM(begin, "dwfl_begin");
    DW_SYM(end, "dwfl_end");
    DW_SYM(report_begin, "dwfl_report_begin");
    DW_SYM(linux_proc_report, "dwfl_linux_proc_report");
    DW_SYM(report_end, "dwfl_report_end");
    DW_SYM(addrmodule, "dwfl_addrmodule");
    DW_SYM(module_addrname, "dwfl_module_addrname");
    DW_SYM(module_getsrc, "dwfl_module_getsrc");
    DW_SYM(lineinfo, "dwfl_lineinfo");
    *(void **)&dw_callbacks.find_elf = shim_dlsym(h, "dwfl_linux_proc_find_elf");
    *(void **)&dw_callbacks.find_debuginfo = shim_dlsym(h, "dwfl_build_id_find_debuginfo");
    if (!dw_callbacks.find_elf || !dw_callbacks.find_debuginfo)
        return;
    dw_ok = true;
    *(void **)&dw.module_getdwarf = shim_dlsym(h, "dwfl_module_getdwarf");
    *(void **)&dw.get_units = shim_dlsym(h, "dwarf_get_units");
    *(void **)&dw.ranges = shim_dlsym(h, "dwarf_ranges");
    *(void **)&dw.getsrc_die = shim_dlsym(h, "dwarf_getsrc_die");
    *(void **)&dw.linesrc = shim_dlsym(h, "dwarf_linesrc");
    *(void **)&dw.lineno = shim_dlsym(h, "dwarf_lineno");
    dw_units_ok = dw.module_getdwarf && dw.get_units && dw.ranges && dw.getsrc_die &&
                  dw.linesrc && dw.lineno;
}

/* ---- the cache ---------------------------------------------------------- */

/* Cached answers, by id (index + 1), found through the shared index
 * (hashidx.h; one thread per report, so not lock-free). */
typedef struct sym_entry {
    uintptr_t addr;
    shim_symbol sym;
} sym_entry;

typedef struct cu_range {
    Dwarf_Addr lo, hi;                /* module-relative (minus bias) */
    Dwarf_Die cu;
} cu_range;

typedef struct mod_index {
    Dwfl_Module *mod;
    Dwarf_Addr bias;
    cu_range *r;                      /* sorted by lo; NULL: no DWARF */
    size_t n;
} mod_index;

struct shim_symbolizer {
    mod_index *mods;
    size_t nmods, capmods;
    sym_entry *entries;
    size_t nentries, capentries;
    shim_hashidx index;
    Dwfl *dwfl;
    bool dwfl_tried;
    char **strings;                 /* every string we own */
    size_t nstrings, capstrings;
    char exe[4096];
};

static uint64_t addr_hash(uintptr_t addr)
{
    uint64_t h = addr * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29); /* the index takes low bits */
}

static uint64_t entry_hash(const void *ctx, uint32_t id)
{
    const shim_symbolizer *s = ctx;
    return addr_hash(s->entries[id - 1].addr);
}

static bool entry_eq(const void *ctx, uint32_t id, uint64_t hash, const void *key)
{
    const shim_symbolizer *s = ctx;
    (void)hash;
    return s->entries[id - 1].addr == *(const uintptr_t *)key;
}

/* C++ names are demangled with the program's own C++ runtime when it has
 * one loaded (never loaded by us). Looked up at each report until found: a
 * runtime can arrive after the first report, and often in a local scope
 * where RTLD_DEFAULT does not see it (PyTorch's libstdc++ is a dependency
 * of extension modules Python opens RTLD_LOCAL), hence the no-load opens
 * by soname. */
static void find_demangler(void)
{
    if (atomic_load_explicit(&g_demangle, memory_order_acquire))
        return;
    demangle_fn fn;
    *(void **)&fn = shim_dlsym(RTLD_DEFAULT, "__cxa_demangle");
    static const char *const runtimes[] = {"libstdc++.so.6", "libc++abi.so.1", "libc++.so.1"};
    for (size_t i = 0; !fn && i < sizeof runtimes / sizeof runtimes[0]; i++) {
        void *h = shim_dlopen_noload(runtimes[i], RTLD_LAZY | RTLD_LOCAL);
        if (h) {
            *(void **)&fn = shim_dlsym(h, "__cxa_demangle");
            shim_dlclose(h);      /* only drops the reference the open took */
        }
    }
    if (fn)
        atomic_store_explicit(&g_demangle, fn, memory_order_release);
}

shim_symbolizer *shim_symbolizer_create(void)
{
    pthread_once(&dw_once, dw_load);
    find_demangler();
    shim_symbolizer *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->index = (shim_hashidx)SHIM_HASHIDX_INIT(entry_hash, entry_eq, s, false);
    ssize_t n = readlink("/proc/self/exe", s->exe, sizeof s->exe - 1);
    s->exe[n > 0 ? n : 0] = '\0';
    return s;
}

void shim_symbolizer_destroy(shim_symbolizer *s)
{
    if (!s)
        return;
    if (s->dwfl)
        dw.end(s->dwfl);
    for (size_t i = 0; i < s->nmods; i++)
        free(s->mods[i].r);
    free(s->mods);
    for (size_t i = 0; i < s->nstrings; i++)
        free(s->strings[i]);
    free(s->strings);
    shim_hashidx_destroy(&s->index);
    free(s->entries);
    free(s);
}

/* Copies `str` into the symbolizer (NULL stays NULL, and so does a failed
 * copy: names are best effort). */
static const char *keep(shim_symbolizer *s, const char *str, bool owned)
{
    if (!str)
        return NULL;
    char *c = owned ? (char *)str : strdup(str);
    if (!c)
        return NULL;
    if (s->nstrings == s->capstrings) {
        size_t cap = s->capstrings ? s->capstrings * 2 : 64;
        char **ns = realloc(s->strings, cap * sizeof *ns);
        if (!ns) {
            free(c);
            return NULL;
        }
        s->strings = ns;
        s->capstrings = cap;
    }
    s->strings[s->nstrings++] = c;
    return c;
}

/* out->function, demangled where it is a C++ name (out->raw then keeps the
 * mangled one). */
static void keep_function(shim_symbolizer *s, const char *name, shim_symbol *out)
{
    demangle_fn demangle = atomic_load_explicit(&g_demangle, memory_order_acquire);
    out->raw = NULL;
    if (name && demangle && name[0] == '_' && name[1] == 'Z') {
        int status = -1;
        char *d = demangle(name, NULL, NULL, &status);
        if (d && status == 0) {
            out->function = keep(s, d, true);
            out->raw = out->function ? keep(s, name, false) : NULL;
            return;
        }
        free(d);
    }
    out->function = keep(s, name, false);
}

static Dwfl *session(shim_symbolizer *s)
{
    if (!s->dwfl_tried && dw_ok) {
        s->dwfl_tried = true;
        Dwfl *d = dw.begin(&dw_callbacks);
        if (d) {
            dw.report_begin(d);
            if (dw.linux_proc_report(d, getpid()) == 0 && dw.report_end(d, NULL, NULL) == 0)
                s->dwfl = d;
            else
                dw.end(d);
        }
    }
    return s->dwfl;
}

static int range_cmp(const void *a, const void *b)
{
    const cu_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The CU ranges of `mod`, built once per report. */
static const mod_index *module_index(shim_symbolizer *s, Dwfl_Module *mod)
{
    for (size_t i = 0; i < s->nmods; i++)
        if (s->mods[i].mod == mod)
            return &s->mods[i];
    if (s->nmods == s->capmods) {
        size_t cap = s->capmods ? s->capmods * 2 : 16;
        mod_index *nm = realloc(s->mods, cap * sizeof *nm);
        if (!nm)
            return NULL;
        s->mods = nm;
        s->capmods = cap;
    }
    mod_index *m = &s->mods[s->nmods++];
    memset(m, 0, sizeof *m);
    m->mod = mod;
    Dwarf *d = dw.module_getdwarf(mod, &m->bias);
    if (!d)
        return m;
    size_t cap = 0;
    Dwarf_CU *cu = NULL;
    Dwarf_Die cudie;
    while (dw.get_units(d, cu, &cu, NULL, NULL, &cudie, NULL) == 0) {
        Dwarf_Addr base, lo, hi;
        ptrdiff_t off = 0;
        while ((off = dw.ranges(&cudie, off, &base, &lo, &hi)) > 0) {
            if (m->n == cap) {
                cap = cap ? cap * 2 : 64;
                cu_range *nr = realloc(m->r, cap * sizeof *nr);
                if (!nr)
                    return m;
                m->r = nr;
            }
            m->r[m->n++] = (cu_range){.lo = lo, .hi = hi, .cu = cudie};
        }
    }
    if (m->n)
        qsort(m->r, m->n, sizeof *m->r, range_cmp);
    return m;
}

static void line_from_units(shim_symbolizer *s, Dwfl_Module *mod, uintptr_t pc, shim_symbol *out)
{
    const mod_index *m = module_index(s, mod);
    if (!m || !m->n)
        return;
    Dwarf_Addr a = pc - m->bias;
    size_t lo = 0, hi = m->n;         /* last range with r.lo <= a */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (m->r[mid].lo <= a)
            lo = mid;
        else
            hi = mid;
    }
    /* Ranges of different CUs do not overlap; a few steps back cover
     * nested or adjacent entries. */
    for (size_t i = lo + 1; i-- > 0 && lo - i < 4;) {
        if (a < m->r[i].lo || a >= m->r[i].hi)
            continue;
        Dwarf_Die cu = m->r[i].cu;
        Dwarf_Line *l = dw.getsrc_die(&cu, a);
        int lineno = 0;
        const char *file = l ? dw.linesrc(l, NULL, NULL) : NULL;
        if (file && dw.lineno(l, &lineno) == 0) {
            out->file = keep(s, file, false);
            out->line = lineno;
        }
        return;
    }
}

static void resolve(shim_symbolizer *s, uintptr_t addr, shim_symbol *out)
{
    memset(out, 0, sizeof *out);
    /* A return address points after the call; the call itself (what the
     * line table and the symbol must describe) is one byte earlier. */
    uintptr_t pc = addr ? addr - 1 : 0;
    Dl_info info;
    struct link_map *lm = NULL;
    if (shim_dladdr1((void *)pc, &info, (void **)&lm, RTLD_DL_LINKMAP)) {
        const char *obj = info.dli_fname;
        /* The main program's link map has an empty name (dladdr then makes
         * one up from argv[0], possibly relative): use the real path. */
        if ((!obj || !obj[0] || (lm && lm->l_name && !lm->l_name[0])) && s->exe[0])
            obj = s->exe;
        out->object = keep(s, obj, false);
        out->offset = addr - (uintptr_t)info.dli_fbase;
        if (info.dli_sname && info.dli_saddr)
            keep_function(s, info.dli_sname, out);
    }
    Dwfl *d = session(s);
    if (!d)
        return;
    Dwfl_Module *mod = dw.addrmodule(d, pc);
    if (!mod)
        return;
    const char *name = dw.module_addrname(mod, pc);
    if (name) {
        /* .symtab names may carry a symbol version ("f@@GLIBC_2.34"). */
        const char *at = strchr(name, '@');
        char *bare = at ? strndup(name, (size_t)(at - name)) : NULL;
        keep_function(s, bare ? bare : name, out);
        free(bare);
    }
    Dwfl_Line *line = dw.module_getsrc(mod, pc);
    if (line) {
        Dwarf_Addr a;
        int lineno = 0;
        const char *file = dw.lineinfo(line, &a, &lineno, NULL, NULL, NULL);
        if (file) {
            out->file = keep(s, file, false);
            out->line = lineno;
        }
    } else if (dw_units_ok) {
        line_from_units(s, mod, pc, out);
    }
}

void shim_symbolize(shim_symbolizer *s, uintptr_t addr, shim_symbol *out)
{
    uint64_t h = addr_hash(addr);
    uint32_t id = shim_hashidx_find(&s->index, h, &addr);
    if (id) {
        *out = s->entries[id - 1].sym;
        return;
    }
    resolve(s, addr, out);
    if (s->nentries == s->capentries) {
        size_t cap = s->capentries ? s->capentries * 2 : 256;
        sym_entry *ne = realloc(s->entries, cap * sizeof *ne);
        if (!ne)
            return;                            /* stays correct, just uncached */
        s->entries = ne;
        s->capentries = cap;
    }
    if (s->nentries >= UINT32_MAX - 1 || !shim_hashidx_reserve(&s->index, 1))
        return;
    s->entries[s->nentries++] = (sym_entry){ .addr = addr, .sym = *out };
    shim_hashidx_insert(&s->index, h, (uint32_t)s->nentries);
}
