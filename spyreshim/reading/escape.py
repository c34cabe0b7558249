"""Names made safe to show: for a terminal, every control character escaped.

Owns the one escaping of program-controlled text (function, file and object
names, runtime names, paths) that the readers print to a terminal, so that a
crafted name (an escape sequence in a Python function's name) cannot move
the cursor, erase lines or forge a summary; the C side's counterpart is
shim/base/escape.c. HTML pages use html.escape and prototype-free maps
instead (timeline.py, flamegraph.py).

Paths are bytes: the shim writes a byte that is not UTF-8 as the lone
surrogate U+DC00+byte (Python's surrogateescape, PEP 383;
docs/report-format.md), so os.fsencode(name) gives the original bytes back.
Shown here as \\xNN, readable and unambiguous. Other lone surrogates (which
cannot be printed or encoded) show as \\udNNN.
"""

import re

# C0 controls, DEL, C1 controls, and every surrogate (U+D800..U+DFFF).
_BAD = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _one(m):
    c = m.group()
    named = _NAMED.get(c)
    if named:
        return named
    o = ord(c)
    if 0xDC80 <= o <= 0xDCFF:
        return "\\x%02x" % (o - 0xDC00)   # a byte that was not UTF-8
    if o >= 0xD800:
        return "\\u%04x" % o
    return "\\x%02x" % o


def terminal(s):
    """`s` with control characters and surrogates escaped (as the log's
    escaping, shim/base/escape.c: backslashes stay as they are): one line,
    printable, encodable as UTF-8. Idempotent. None stays None."""
    if s is None:
        return None
    s = str(s)
    if _BAD.search(s) is None:
        return s
    return _BAD.sub(_one, s)


def text_out(s):
    """A whole text for a terminal whose names were already escaped: the
    layout's newlines and tabs kept, anything else that slipped through
    (a control character, a surrogate) escaped."""
    return "\n".join("\t".join(terminal(p) for p in line.split("\t"))
                     for line in s.split("\n"))
