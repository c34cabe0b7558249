"""Sizes as text, one way for every view and report: the exact count of
bytes, then, from 1 KiB up, the binary-unit reading in brackets,
`268435456 B (256.0 MiB)` (`512 B` below 1 KiB), as the shim's own text
(shim/base/units.c) writes them; and sizes read from the command line.

Owns nothing but these two conversions; pure functions, stdlib only.
"""

_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_size(n):
    """268435456 -> '268435456 B (256.0 MiB)'; 512 -> '512 B'."""
    n = int(n)
    if -1024 < n < 1024:
        return "%d B" % n
    v = float(abs(n))
    for unit in _UNITS:
        v /= 1024.0
        if v < 1024 or unit == _UNITS[-1]:
            return "%d B (%s%.1f %s)" % (n, "-" if n < 0 else "", v, unit)
    raise AssertionError("unreachable")


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}


def parse_size(text):
    """'2G', '512MiB', '1.5 GB', '4096' -> bytes (binary units, as the shim's
    SPYRESHIM_LIMIT). Raises ValueError with a readable message."""
    s = str(text).strip()
    i = 0
    while i < len(s) and (s[i].isdigit() or s[i] == "."):
        i += 1
    number, unit = s[:i], s[i:].strip().lower()
    if not number or number.count(".") > 1 or unit not in _SIZE_UNITS:
        raise ValueError("invalid size %r (expected e.g. 4096, 512M, 2G, 1.5GiB)" % text)
    value = float(number) * _SIZE_UNITS[unit] if "." in number else int(number) * _SIZE_UNITS[unit]
    return int(value)


# ------------------------------------------------------------------- axes

def _step(span, n, candidates):
    """The smallest candidate step that puts at most n intervals on span."""
    for c in candidates:
        if span / c <= n:
            return c
    return candidates[-1]


def size_ticks(top, n=5):
    """Round values for a bytes axis from 0 to top: multiples of 1, 2 or 5
    (times 10, 100) of a binary unit, at most n intervals up to the first
    tick at or above top. [(value, label)], labels short ('256 MiB')."""
    top = max(int(top), 1)
    cands = [m << (10 * u) for u in range(0, 6) for m in (1, 2, 5, 10, 20, 50, 100, 200, 500)]
    cands = sorted(set(cands))
    step = _step(top, n, cands)
    unit = max(u for u in range(0, 6) if step >= (1 << (10 * u)))
    name = ("B",) + _UNITS
    out, v = [], 0
    while True:
        out.append((v, "%g %s" % (v / float(1 << (10 * unit)), name[unit]) if v else "0"))
        if v >= top:
            return out
        v += step


def time_ticks(span_s, n=6):
    """Round times for an axis from 0 to span_s seconds: a step of 1, 2 or 5
    times a power of ten, at most n intervals; the ticks within [0, span_s].
    [(seconds, label)]."""
    span = max(float(span_s), 1e-9)
    cands = [m * 10.0 ** e for e in range(-9, 7) for m in (1, 2, 5)]
    step = _step(span, n, cands)
    out, k = [], 0
    while k * step <= span * (1 + 1e-9):
        v = k * step
        out.append((v, _seconds(v, step) if k else "0"))
        k += 1
    return out


def _seconds(v, step):
    if step >= 1:
        return "%g s" % v
    if step >= 1e-3:
        return "%g ms" % round(v * 1e3, 6)
    if step >= 1e-6:
        return "%g µs" % round(v * 1e6, 6)
    return "%g ns" % round(v * 1e9, 6)
