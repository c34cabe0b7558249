/* The address ranges of CPython's evaluation loop, _PyEval_EvalFrameDefault,
 * including the parts the compiler split off it (GCC's hot/cold partition
 * moves most of the loop of Debian's 3.14 and 3.15 builds into a part of
 * its own) which carry no symbol in a stripped object: a leak report must
 * still find the evaluation-loop frames to splice Python frames in.
 *
 * How: the exported entry's function range comes from the object's unwind
 * table (.eh_frame_hdr, present in every object that can be unwound); the
 * entry's code is scanned for direct jumps (jmp/jcc rel32) out of it, and a
 * jump that lands exactly on the start of another unwind-table function
 * with no symbol of its own is a split part. Anything unexpected (another
 * table encoding, a start that does not check out) finds nothing more than
 * the entry's own range, and the report falls back to names.
 *
 * Report time only, on the reporting thread; owns no state and takes no
 * lock (the dynamic loader's, through dl_iterate_phdr and dladdr). Never
 * runs on the allocation path. Reads only mapped, executable code and the
 * read-only unwind table of a loaded object. */
#include "evalloop.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "loader.h"

/* .eh_frame_hdr with the encodings every GNU linker writes: a table of
 * (start, FDE) pairs as 4-byte signed offsets from the header itself. */
typedef struct ehtable {
    uintptr_t hdr;
    const int32_t *table;      /* pairs */
    uint32_t count;
} ehtable;

struct find_ctx {
    uintptr_t addr;
    ehtable t;
    uintptr_t text_lo, text_hi;
    bool found;
};

static int find_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct find_ctx *c = data;
    const ElfW(Phdr) *eh = NULL;
    bool inside = false;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_GNU_EH_FRAME)
            eh = ph;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
            if (c->addr >= lo && c->addr < hi) {
                inside = true;
                c->text_lo = lo;
                c->text_hi = hi;
            }
        }
    }
    if (!inside)
        return 0;
    if (eh) {
        const uint8_t *h = (const uint8_t *)(info->dlpi_addr + eh->p_vaddr);
        /* version 1; eh_frame_ptr pcrel|sdata4; count udata4; table datarel|sdata4 */
        if (h[0] == 1 && h[1] == 0x1b && h[2] == 0x03 && h[3] == 0x3b) {
            uint32_t count;
            memcpy(&count, h + 8, 4);
            c->t.hdr = (uintptr_t)h;
            c->t.table = (const int32_t *)(h + 12);
            c->t.count = count;
            c->found = true;
        }
    }
    return 1;
}

/* The table entry whose function holds `addr`: its start and end (from
 * the FDE: a 4-byte pc-relative start, then a 4-byte length, as GCC
 * writes them; checked against the table's start). */
static bool function_of(const ehtable *t, uintptr_t addr, uintptr_t *lo, uintptr_t *hi)
{
    uint32_t a = 0, b = t->count;
    while (b - a > 1) {
        uint32_t m = a + (b - a) / 2;
        if (t->hdr + (intptr_t)t->table[2 * m] <= addr)
            a = m;
        else
            b = m;
    }
    if (t->count == 0)
        return false;
    uintptr_t start = t->hdr + (intptr_t)t->table[2 * a];
    const uint8_t *fde = (const uint8_t *)(t->hdr + (intptr_t)t->table[2 * a + 1]);
    uint32_t length;
    int32_t rel;
    uint32_t range;
    memcpy(&length, fde, 4);
    if (length == 0 || length == 0xffffffffu || length < 16)
        return false;
    memcpy(&rel, fde + 8, 4);
    memcpy(&range, fde + 12, 4);
    if ((uintptr_t)(fde + 8) + (intptr_t)rel != start || addr < start || addr >= start + range)
        return false;
    *lo = start;
    *hi = start + range;
    return true;
}

void shim_evalloop_find(uintptr_t entry, shim_evalloop *e)
{
    memset(e, 0, sizeof *e);
    if (!entry)
        return;
    struct find_ctx c = {.addr = entry};
    shim_dl_iterate_phdr(find_object, &c);
    uintptr_t lo, hi;
    if (!c.found || !function_of(&c.t, entry, &lo, &hi) || hi > c.text_hi)
        return;
    e->lo[0] = lo;
    e->hi[0] = hi;
    e->n = 1;
    const uint8_t *code = (const uint8_t *)lo;
    size_t len = hi - lo;
    for (size_t i = 0; i + 5 <= len && e->n < SHIM_EVALLOOP_PARTS; i++) {
        size_t at;
        if (code[i] == 0xe9)
            at = i + 1;                                 /* jmp rel32 */
        else if (code[i] == 0x0f && i + 6 <= len && (code[i + 1] & 0xf0) == 0x80)
            at = i + 2;                                 /* jcc rel32 */
        else
            continue;
        int32_t rel;
        memcpy(&rel, code + at, 4);
        uintptr_t target = lo + at + 4 + (intptr_t)rel;
        if ((target >= lo && target < hi) || target < c.text_lo || target >= c.text_hi)
            continue;
        uintptr_t plo, phi;
        if (!function_of(&c.t, target, &plo, &phi) || plo != target || phi > c.text_hi)
            continue;
        bool known = false;
        for (unsigned k = 0; k < e->n; k++)
            known |= e->lo[k] == plo;
        if (known)
            continue;
        /* A named function is a tail call, not a part of the loop. */
        Dl_info info;
        if (shim_dladdr((const void *)target, &info) && info.dli_saddr == (void *)target)
            continue;
        e->lo[e->n] = plo;
        e->hi[e->n] = phi;
        e->n++;
    }
}

bool shim_evalloop_contains(const shim_evalloop *e, uintptr_t pc)
{
    /* A return address: the call is the byte before it. */
    for (unsigned k = 0; k < e->n; k++)
        if (pc - 1 >= e->lo[k] && pc - 1 < e->hi[k])
            return true;
    return false;
}
