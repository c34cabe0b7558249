"""`spyreshim report` over several processes of one launch: one row per
rank (peak in use, reserved, capacity and headroom, collections and what
they freed, out-of-memory failures with their verdict) and which rank had
the highest peak, the least headroom and the first out-of-memory; and
`--diff-ranks A B`, what rank B held at its peak that rank A did not.

Inputs are traces (SPYRESHIM_TRACE) and leak reports (SPYRESHIM_REPORT and
their `.oom`), given as files, folders or globs. A file's rank is the
launcher's, from the trace's process record or the report's fields
(docs/trace-format.md, "Ranks"); a file without one is named by its pid.
A trace and reports of one process are one row. Times are the launch's
wall clock: from the earliest trace's start, not each process's.

The rank that ran out of memory first comes first, with its stacks as the
single-process out-of-memory report gives them (report.text): the stack
of the request that failed (from its trace) and of the largest groups
live at that moment (from its trace, else its `.oom` report).

Each trace is read in one streaming pass (trace.batches()), and the first
out-of-memory rank's once more, up to that failure; memory is one trace's
chunks in flight, the rows, and that rank's live set, never the events."""

import glob
import os

from ..reading import callorder
from ..reading import report as rpt
from ..reading import trace as tr

_SEGMENT = bytes(1 if k in (tr.SEGMENT_ALLOC, tr.SEGMENT_FREE) else 0 for k in range(256))
_MARK = bytes(1 if k in (tr.GC, tr.OOM, tr.SEGMENT_ALLOC, tr.SEGMENT_FREE) else 0
              for k in range(256))


def expand(paths):
    """Files named by paths: a folder's traces and reports (sorted), a glob's
    matches, a file itself."""
    out = []
    for p in paths:
        p = str(p)
        if os.path.isdir(p):
            try:
                hits = sorted(os.path.join(p, f) for f in os.listdir(p)
                              if f.endswith((".trace", ".json", ".oom")))
            except OSError as e:
                raise rpt.ReportError("cannot read %s: %s" % (p, e.strerror or e))
            if not hits:
                raise rpt.ReportError("cannot read %s: a folder that holds no trace or report "
                                      "(*.trace, *.json, *.oom)" % p)
            out += hits
        elif not os.path.exists(p) and glob.has_magic(p):
            hits = sorted(glob.glob(p))
            if not hits:
                raise rpt.ReportError("%s: no file matches" % p)
            out += hits
        else:
            out.append(p)
    return out


class Row(object):
    """One process of the launch, from its trace and its reports."""

    def __init__(self):
        self.launch = {}
        self.pid = None
        self.files = []
        self.trace = None
        self.start_ns = None        # the trace's CLOCK_REALTIME start
        self.peak = None            # bytes live at the peak (served devices)
        self.reserved = None        # the most bytes of regions held at once
        self.capacity = None        # bytes the program may have (smallest device's)
        self.headroom = None
        self.collections = 0
        self.freed = 0
        self.ooms = 0
        self.first_oom_ns = None    # wall clock of the first out-of-memory
        self.oom_request = None
        self.oom_site = None        # where the first out-of-memory was asked for
        self.oom_event = None       # (index, site, device) of it in the trace
        self.oom_report = None      # the `.oom` report's path
        self.verdict = None
        self.truncated = False

    @property
    def rank(self):
        return self.launch.get("rank")

    def label(self):
        if self.rank is None:
            return "pid %s" % self.pid
        r = "rank %d" % self.rank
        return r + (" (restart %d)" % self.launch["restart"] if self.launch.get("restart") else "")


def _key(launch, pid):
    if "rank" in launch:
        return ("rank", launch.get("run_id"), launch.get("restart", 0), launch["rank"])
    return ("pid", launch.get("host"), pid)


def _where(marks):
    """Indexes of the 1 bytes of marks: the markers and regions only (a few
    per thousand events), found by bytes.find at C speed."""
    i = marks.find(1)
    while i >= 0:
        yield i
        i = marks.find(1, i + 1)


def _read_trace(row, t, path):
    row.trace, row.truncated = path, t.truncated
    row.start_ns = t.start_realtime_ns
    pt = tr.PeakTracker()
    reserved = top = 0
    first = None
    for b in t.batches():
        pt.feed(b, tr.deltas(b))
        marks = b.kind.tobytes().translate(_MARK)
        if marks.find(1) < 0:
            continue
        size, kind, dev, time, site = b.size, b.kind, b.dev, b.time, b.site
        for i in _where(marks):
            k = kind[i]
            if k == tr.GC:
                row.collections += 1
                row.freed += size[i]
            elif k == tr.OOM:
                row.ooms += 1
                if first is None:
                    first = time[i]
                    row.oom_request = size[i]
                    row.oom_site = callorder.label(t, site[i]) if site[i] else None
                    row.oom_event = (b.start + i, site[i], dev[i])
            elif dev[i] not in tr.PASSTHROUGH_DEVICES:
                reserved += size[i] if k == tr.SEGMENT_ALLOC else -size[i]
                top = max(top, reserved)
    p = pt.p
    row.peak, row.reserved = p.bytes, top
    if first is not None:
        row.first_oom_ns = t.start_realtime_ns + first
    # The device with the least room left decides: capacity minus its peak.
    rooms = [(cap - p.per_device.get(d, (0, -1))[0], cap) for d, cap in t.capacity.items()]
    if rooms:
        row.headroom, row.capacity = min(rooms)


def gather(paths):
    """[Row] of the files, ordered by rank (then pid)."""
    rows = {}
    for path in expand(paths):
        if tr.is_trace(path):
            t = tr.stream(path)
            key = _key(t.process, t.pid)
            row = rows.setdefault(key, Row())
            row.launch, row.pid = t.process, t.pid
            _read_trace(row, t, path)
        else:
            r = rpt.load(path)
            key = _key(r["launch"], r["pid"])
            row = rows.setdefault(key, Row())
            row.launch = row.launch or r["launch"]
            row.pid = r["pid"] if row.pid is None else row.pid
            oom = r.get("oom")
            if r["reason"] == "oom" and oom:
                row.verdict = oom.get("verdict")
                row.oom_report = path
                if row.trace is None:
                    row.ooms = max(row.ooms, 1)
                    row.oom_request = oom.get("request")
        row.files.append(path)
    return sorted(rows.values(), key=lambda r: (r.rank is None, r.rank or 0, r.pid or 0))


def _size(n):
    return "-" if n is None else rpt.format_size(n)


def first_oom(rows):
    """The row of the earliest out-of-memory (a trace has its time; a rank
    known from its `.oom` report alone comes after those), or None."""
    ooms = [r for r in rows if r.ooms]
    if not ooms:
        return None
    return min(ooms, key=lambda r: (r.first_oom_ns is None, r.first_oom_ns or 0))


# Groups live at the failure shown when --top is not given: the shim's own
# out-of-memory report's default (SPYRESHIM_OOM_REPORT).
OOM_TOP = 10


def oom_stacks(r, top=0, native_frames="folded"):
    """Lines: the stacks of rank r's first out-of-memory, as `spyreshim
    report` prints an `.oom` report (report.text): the request that failed
    (its trace only) and the largest groups live at that moment (from its
    trace, else from its `.oom` report, which the shim wrote at its last
    failure)."""
    top = top or OOM_TOP
    lines = []
    if r.trace is not None and r.oom_event is not None:
        index, site, dev = r.oom_event
        t = tr.stream(r.trace)
        g = dict(callorder.group(t, site), bytes=r.oom_request, count=1,
                 runtime=t.device_name(dev), suppressed=False)
        head = "Request of %s of %s memory that failed, asked from:" % (
            rpt.format_size(r.oom_request), rpt._t(g["runtime"]))
        lines.append(rpt.group_text(g, native_frames=native_frames, head=head))
        lines.append("")
        live = callorder.live_report(t, tr.live_at(t, index), "oom")
        lines.append(rpt.text(rpt.merge([live]), top=top, native_frames=native_frames))
        lines.append("(from %s, what was live at its event %d)" % (rpt._t(r.trace), index + 1))
    elif r.oom_report is not None:
        lines.append("(the failing request's stack is in a trace only: spyreshim run --trace)")
        lines.append("")
        lines.append(rpt.text(rpt.merge([rpt.load(r.oom_report)]), top=top,
                              native_frames=native_frames))
        lines.append("(from %s)" % rpt._t(r.oom_report))
    return [ln.rstrip("\n") for ln in lines]


def text(rows, top=0, native_frames="folded"):
    starts = [r.start_ns for r in rows if r.start_ns]
    t0 = min(starts) if starts else None
    lines = []
    ids = {r.launch.get("run_id") for r in rows} - {None}
    sizes = {r.launch.get("world_size") for r in rows} - {None}
    lines.append("spyreshim: %d process%s%s%s" % (
        len(rows), "" if len(rows) == 1 else "es",
        ", run id %s" % ", ".join(sorted(ids)) if ids else "",
        ", world size %s" % ", ".join(map(str, sorted(sizes))) if sizes else ""))
    # The rank that ran out first, with its stacks: what a reader of a
    # failed launch needs first; the table and the summary follow.
    first = first_oom(rows)
    if first is not None:
        at = ("+%.3f s, " % ((first.first_oom_ns - t0) / 1e9)
              if first.first_oom_ns and t0 else "")
        lines.append("")
        lines.append("== first out-of-memory: %s (pid %s, host %s), %s%s asked%s ==" % (
            first.label(), first.pid, first.launch.get("host", "-"), at,
            _size(first.oom_request), ", verdict: %s" % first.verdict if first.verdict else ""))
        lines.extend(oom_stacks(first, top, native_frames))
        lines.append("")
        lines.append("== every process ==")
    head = ("process", "host", "pid", "peak in use", "reserved", "capacity", "headroom",
            "collections (freed)", "OOMs", "first OOM")
    table = [head]
    for r in rows:
        oom = "-"
        if r.ooms:
            at = ("+%.3f s" % ((r.first_oom_ns - t0) / 1e9)) if r.first_oom_ns and t0 else "?"
            oom = "%s, %s asked%s" % (at, _size(r.oom_request),
                                      ", verdict: %s" % r.verdict if r.verdict else "")
        table.append((r.label(), r.launch.get("host", "-"), str(r.pid), _size(r.peak),
                      _size(r.reserved), _size(r.capacity), _size(r.headroom),
                      "%d (%s)" % (r.collections, _size(r.freed)), str(r.ooms), oom))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.append("")
    peaks = [r for r in rows if r.peak is not None]
    if peaks:
        r = max(peaks, key=lambda r: r.peak)
        lines.append("highest peak:   %s, %s" % (r.label(), _size(r.peak)))
    rooms = [r for r in rows if r.headroom is not None]
    if rooms:
        r = min(rooms, key=lambda r: r.headroom)
        lines.append("least headroom: %s, %s of %s" % (r.label(), _size(r.headroom),
                                                       _size(r.capacity)))
    r = first
    if r is not None:
        lines.append("first OOM:      %s%s" % (r.label(), ", verdict: %s" % r.verdict
                                               if r.verdict else ""))
        if r.oom_site:
            lines.append("                %s asked at %s" % (_size(r.oom_request), r.oom_site))
    else:
        lines.append("first OOM:      none")
    for r in rows:
        if r.truncated:
            lines.append("note: %s's trace is truncated (the process did not exit); what was "
                         "flushed is counted" % r.label())
    return "\n".join(lines) + "\n"


def find(rows, name):
    """The row of rank `name` (a number), or of pid `name` where no rank has it."""
    try:
        n = int(name)
    except ValueError:
        raise rpt.ReportError("--diff-ranks: %r is not a rank" % name)
    for r in rows:
        if r.rank == n:
            return r
    for r in rows:
        if r.rank is None and r.pid == n:
            return r
    raise rpt.ReportError("--diff-ranks: no rank %d among the files given" % n)


def diff_ranks(rows, a, b):
    """(growth, title): what rank b held at its peak that rank a did not,
    by allocation site (diff.of_reports on the two peaks' live sets)."""
    from . import diff
    from . import tracepeak
    ra, rb = find(rows, a), find(rows, b)
    reps = []
    for r in (ra, rb):
        if r.trace is None:
            raise rpt.ReportError("--diff-ranks: %s has no trace (spyreshim run --trace)"
                                  % r.label())
        _p, peaks = tracepeak.peak_reports(tr.stream(r.trace))
        reps.append(peaks[0][1])
    return diff.of_reports(reps[0], reps[1]), "at %s's peak beyond %s's" % (rb.label(),
                                                                          ra.label())
