"""`spyreshim report --pprof OUT.pb.gz TRACE`: live device memory by stack
as a pprof profile (github.com/google/pprof, proto/profile.proto), so that
`go tool pprof -top OUT.pb.gz` reads it and `-diff_base` compares two runs.

Our own writer of the protobuf wire format (stdlib only): varints and
length-delimited fields, gzip around them. Two sample types, inuse_objects
(count) and inuse_space (bytes, the default); one sample per (device,
site) of the live set, its locations innermost first in call order
(callorder.py, folded frames left out), one location per distinct frame
with one line, one function per distinct (name, file). A label `device`
names the runtime. The moment: the peak (default), the end, or `--at T`.
A leak report, snapshot or `--diff`'s growth gives the same profile of its
groups (`report --pprof OUT.pb.gz REPORT.json`: what leaked, by stack).
"""

import gzip

from ..reading import callorder
from ..reading import report as rpt
from ..reading import trace as tr


def _varint(v):
    out = bytearray()
    v &= (1 << 64) - 1          # negative int64 as two's complement
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field, wire):
    return _varint((field << 3) | wire)


def _int(field, v):
    return _key(field, 0) + _varint(v) if v else b""


def _bytes(field, b):
    return _key(field, 2) + _varint(len(b)) + b


def _packed(field, values):
    body = b"".join(_varint(v) for v in values)
    return _bytes(field, body) if values else b""


class _Strings(object):
    def __init__(self):
        self.table = [""]
        self.index = {"": 0}

    def __call__(self, s):
        s = s or ""
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def profile(t, live, comment=""):
    """The serialized (not compressed) Profile of a live set
    {(dev, addr): (size, site, index)}."""
    groups = {}
    for (d, _a), (sz, site, _i) in live.items():
        g = groups.setdefault((d, site), [0, 0])
        g[0] += 1
        g[1] += sz
    samples = [(callorder.visible(t, site), t.device_name(d), count, nbytes)
               for (d, site), (count, nbytes) in sorted(groups.items(), key=lambda kv: -kv[1][1])]
    return _encode(samples, t.start_realtime_ns, comment)


def report_profile(r, comment="", show_suppressed=False):
    """The Profile of a leak report, snapshot or growth (report.merge's or
    diff.py's shape): one sample per group, its bytes and allocations by
    stack (what heaptrack's and jeprof's leak profiles hold)."""
    samples = [(rpt.visible_frames(g), g["runtime"], g["count"], g["bytes"])
               for g in r["groups"] if show_suppressed or not g["suppressed"]]
    return _encode(samples, 0, comment)


def _encode(samples, start_ns, comment):
    """samples: [(frames innermost first, device name, count, bytes)]."""
    st = _Strings()
    funcs, locs = {}, {}
    fn_msgs, loc_msgs, out_samples = [], [], []
    for frames, device, count, nbytes in samples:
        ids = []
        for f in frames:
            if f["kind"] == "python":
                name = f["function"] or "<unknown>"
                file = f["file"] or ""
            else:
                name = f["function"] or rpt.frame_label(f)
                file = f["file"] or f["object"] or ""
            fkey = (name, file)
            fid = funcs.get(fkey)
            if fid is None:
                fid = funcs[fkey] = len(funcs) + 1
                fn_msgs.append(_int(1, fid) + _int(2, st(name)) + _int(3, st(name)) +
                               _int(4, st(file)))
            lkey = (fid, f["line"] or 0)
            lid = locs.get(lkey)
            if lid is None:
                lid = locs[lkey] = len(locs) + 1
                line = _int(1, fid) + _int(2, f["line"] or 0)
                loc_msgs.append(_int(1, lid) + _bytes(4, line))
            ids.append(lid)
        if not ids:
            fkey = ("[no stack recorded]", "")
            fid = funcs.get(fkey)
            if fid is None:
                fid = funcs[fkey] = len(funcs) + 1
                fn_msgs.append(_int(1, fid) + _int(2, st(fkey[0])))
            lid = locs.get((fid, 0))
            if lid is None:
                lid = locs[(fid, 0)] = len(locs) + 1
                loc_msgs.append(_int(1, lid) + _bytes(4, _int(1, fid)))
            ids.append(lid)
        label = _int(1, st("device")) + _int(2, st(device))
        out_samples.append(_packed(1, ids) + _packed(2, [count, nbytes]) + _bytes(3, label))
    out = bytearray()
    for typ, unit in (("inuse_objects", "count"), ("inuse_space", "bytes")):
        out += _bytes(1, _int(1, st(typ)) + _int(2, st(unit)))
    for s in out_samples:
        out += _bytes(2, s)
    for m in loc_msgs:
        out += _bytes(4, m)
    for m in fn_msgs:
        out += _bytes(5, m)
    period = _int(1, st("space")) + _int(2, st("bytes"))
    ctext = st(comment) if comment else 0
    tail = _int(9, start_ns) + _bytes(11, period) + _int(12, 1)
    if ctext:
        tail += _packed(13, [ctext])
    tail += _int(14, st("inuse_space"))
    for s in st.table:
        out += _bytes(6, s.encode("utf-8"))
    out += tail
    return bytes(out)


def moment(t, at):
    """(event index, words) for the peak (None), "end" or an --at value;
    the words give the moment's time, not its event number."""
    if at is None:
        p = tr.peaks(t)
        i, what = p.index, "the peak (%s)" % rpt.format_size(p.bytes)
    elif at == "end":
        i, what = len(t) - 1, "the end of the trace"   # a counting pass when streaming
    else:
        i, what = tr.at_index(t, at), None
    if i < 0:
        return i, what or "the start"
    when = tr.seconds(tr.times_at(t, [i])[i])
    return i, "%s at %s" % (what, when) if what else when


def write(t, path, at=None):
    i, words = moment(t, at)
    live = tr.live_at(t, i) if i >= 0 else {}
    data = profile(t, live, "spyreshim: live device memory at %s of %s" % (words, t.path))
    with gzip.open(path, "wb") as f:
        f.write(data)
    return words, live


def write_report(r, path, comment, show_suppressed=False):
    """A leak report's (or a growth's) profile to path, gzipped."""
    data = report_profile(r, "spyreshim: " + comment, show_suppressed)
    with gzip.open(path, "wb") as f:
        f.write(data)
