/* Sizes as text: the exact count of bytes, then from 1 KiB up its reading
 * in binary units, `268435456 B (256.0 MiB)`, the one format of every size
 * the shim prints (leak reports, the lines at exit) and of the Python
 * package's views (spyreshim/units.py writes the same).
 *
 * Owns no state and takes no lock; must never allocate (it runs in the
 * report at exit and on a final out-of-memory). */
#include "units.h"

#include <inttypes.h>
#include <stdio.h>

const char *shim_size_text(char *buf, uint64_t bytes)
{
    static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, SHIM_SIZE_TEXT, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes;
    size_t u = 0;
    for (v /= 1024.0; v >= 1024.0 && u + 1 < sizeof unit / sizeof *unit; u++)
        v /= 1024.0;
    snprintf(buf, SHIM_SIZE_TEXT, "%" PRIu64 " B (%.1f %s)", bytes, v, unit[u]);
    return buf;
}
