/* procaddr: cuGetProcAddress, the way the CUDA runtime reaches every
 * driver function (it dlsyms cuGetProcAddress_v2 and nothing else).
 *
 * No lock: the table (entries.h) is constant. The library is linked
 * -Bsymbolic, so the addresses taken here are our own functions even when
 * a preloaded object exports the same names, as with the real driver.
 * Works before cuInit: the runtime looks functions up first, then calls
 * cuInit through the table. The per-thread default stream flag is
 * accepted; the stand-in has no separate _ptsz/_ptds functions (stream.c
 * serves the per-thread stream by the legacy one), so it answers with the
 * plain functions. */
#include "internal.h"

#include <string.h>

#include "entries.h"

static const struct {
    const char *name;
    int version;
    void *fn;
} table[] = {
#define ROW(name, version, fn) { #name, version, (void *)(fn) },
    CD_ENTRIES(ROW)
#undef ROW
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    if (!symbol || !pfn || flags > (CU_GET_PROC_ADDRESS_LEGACY_STREAM
                                     | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))
        return CUDA_ERROR_INVALID_VALUE;
    int best = -1;
    bool known = false;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, symbol) != 0)
            continue;
        known = true;
        if (table[i].version <= cudaVersion
            && (best < 0 || table[i].version > table[best].version))
            best = (int)i;
    }
    *pfn = best >= 0 ? table[best].fn : NULL;
    if (symbolStatus)
        *symbolStatus = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS
                      : known && best < 0 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                      : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
