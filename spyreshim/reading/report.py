"""Leak report files (docs/report-format.md): loading, merging, text.

Owns the reading side of the JSON the shim writes at exit, on a final
out-of-memory and from spyreshim_snapshot_write_json. Everything here is
pure data work: it never touches the shim, so the CLI, the pytest plugin and
the HTML page share it. A file that does not follow the format is refused
with a ReportError naming the file and the field, never a traceback.
"""

from .escape import terminal as _t
from . import frames as frames_mod
from .units import format_size, parse_size  # noqa: F401 (one formatter: units.py)

FORMAT = "spyreshim-report"
VERSION = 1

REASONS = {
    "exit": "at exit",
    "oom": "at out-of-memory",
    "snapshot": "in a snapshot",
}


class ReportError(Exception):
    """A report file that cannot be read or does not follow the format."""


# What `spyreshim report` reads, said when a file is neither.
EXPECTED = ("expected a leak report or snapshot (JSON with \"format\": \"%s\", written by "
            "--report, SPYRESHIM_REPORT or spyreshim snapshot) or a trace (written by --trace; "
            "it begins with SPYTRACE)" % FORMAT)


# ---------------------------------------------------------------- validation

_INT_MAX = (1 << 64) - 1   # what the shim writes (uint64_t); 10**400 is not a count


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and -_INT_MAX <= v <= _INT_MAX


def _opt_str(where, d, key):
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise ReportError("%s.%s: expected a string, got %s" % (where, key, type(v).__name__))
    return v


def _frame(where, f):
    if not isinstance(f, dict):
        raise ReportError("%s: expected an object" % where)
    kind = f.get("kind")
    if kind not in ("python", "native"):
        raise ReportError("%s.kind: expected \"python\" or \"native\", got %r" % (where, kind))
    line = f.get("line")
    if line is not None and not _is_int(line):
        raise ReportError("%s.line: expected an integer" % where)
    out = {"kind": kind, "line": line if line else None}
    for key in ("function", "file", "object", "address", "offset"):
        out[key] = _opt_str(where, f, key)
    # Hybrid stacks (docs/report-format.md); absent in older files.
    out["interpreter"] = bool(f.get("interpreter", False))
    out["folded"] = bool(f.get("folded", False))
    ran = f.get("python_frames")
    if ran is not None and (not _is_int(ran) or ran < 0):
        raise ReportError("%s.python_frames: expected a non-negative integer" % where)
    out["python_frames"] = ran
    return out


def _group(where, g):
    if not isinstance(g, dict):
        raise ReportError("%s: expected an object" % where)
    for key in ("bytes", "count"):
        if not _is_int(g.get(key)) or g[key] < 0:
            raise ReportError("%s.%s: expected a non-negative integer" % (where, key))
    frames = g.get("frames", [])
    if not isinstance(frames, list):
        raise ReportError("%s.frames: expected a list" % where)
    return {
        "bytes": g["bytes"],
        "count": g["count"],
        "runtime": _opt_str(where, g, "runtime") or "?",
        "suppressed": bool(g.get("suppressed", False)),
        "order": _opt_str(where, g, "order"),
        "unspliced": _opt_str(where, g, "unspliced"),
        "frames": [_frame("%s.frames[%d]" % (where, i), f) for i, f in enumerate(frames)],
    }


def _nonneg(where, d, key):
    v = d.get(key, 0)
    if not _is_int(v) or v < 0:
        raise ReportError("%s.%s: expected a non-negative integer" % (where, key))
    return v


def _collections(where, c):
    """The "collections" section (docs/report-format.md), or None."""
    if c is None:
        return None
    if not isinstance(c, dict):
        raise ReportError("%s: expected an object" % where)
    sites, runs = c.get("sites", []), c.get("runs", [])
    if not isinstance(sites, list) or not isinstance(runs, list):
        raise ReportError("%s: \"sites\" and \"runs\": expected lists" % where)
    out = {k: _nonneg(where, c, k) for k in ("count", "freed", "attributed", "blocks", "cost_ns",
                                            "cost_cpu_ns", "runs_dropped")}
    out["sites"] = []
    for i, g in enumerate(sites):
        w = "%s.sites[%d]" % (where, i)
        site = _group(w, g)
        site["collections"] = _nonneg(w, g, "collections")
        out["sites"].append(site)
    out["runs"] = []
    for i, r in enumerate(runs):
        w = "%s.runs[%d]" % (where, i)
        if not isinstance(r, dict) or not isinstance(r.get("sites", []), list):
            raise ReportError("%s: expected an object with a \"sites\" list" % w)
        run = {k: _nonneg(w, r, k) for k in ("at_ns", "duration_ns", "cost_ns", "freed",
                                            "attributed", "blocks")}
        run["sites"] = []
        for j, rs in enumerate(r.get("sites", [])):
            ww = "%s.sites[%d]" % (w, j)
            if not isinstance(rs, dict):
                raise ReportError("%s: expected an object" % ww)
            k = _nonneg(ww, rs, "site")
            if k >= len(out["sites"]):
                raise ReportError("%s.site: %d is not a site (%d listed)" % (ww, k,
                                                                             len(out["sites"])))
            run["sites"].append((k, _nonneg(ww, rs, "bytes"), _nonneg(ww, rs, "count")))
        out["runs"].append(run)
    return out


# The report's launch fields that are numbers (run_id and host are text).
LAUNCH_NUMBERS = ("rank", "local_rank", "world_size", "restart")


def parse(data, name="<report>"):
    """Validates one decoded report object; returns a normalized copy."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ReportError("%s: not a spyreshim report (no \"format\": \"%s\"): %s" % (
            name, FORMAT, EXPECTED))
    version = data.get("version")
    if not _is_int(version) or version < 1:
        raise ReportError("%s: missing or invalid \"version\"" % name)
    if version > VERSION:
        raise ReportError("%s: report version %d is newer than this tool understands (%d)"
                          % (name, version, VERSION))
    groups = data.get("groups")
    if not isinstance(groups, list):
        raise ReportError("%s: \"groups\": expected a list" % name)
    pid = data.get("pid")
    if pid is not None and not _is_int(pid):
        raise ReportError("%s: \"pid\": expected an integer" % name)
    out = {
        "name": name,
        "pid": pid,
        "exe": _opt_str(name, data, "exe"),
        "reason": _opt_str(name, data, "reason") or "exit",
        "python_note": _opt_str(name, data, "python_note"),
        "groups": [_group("%s: groups[%d]" % (name, i), g) for i, g in enumerate(groups)],
        "collections": _collections("%s: collections" % name, data.get("collections")),
    }
    # Which rank of a launch wrote it (docs/report-format.md; absent before).
    launch = {}
    for key in LAUNCH_NUMBERS:
        v = data.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            raise ReportError("%s: \"%s\": expected a non-negative integer" % (name, key))
        if v is not None:
            launch[key] = v
    for key in ("run_id", "host"):
        v = _opt_str(name, data, key)
        if v is not None:
            launch[key] = v
    out["launch"] = launch
    oom = data.get("oom")
    out["oom"] = oom if isinstance(oom, dict) else None
    for key in ("live_bytes", "live_allocations", "suppressed_bytes", "suppressed_allocations"):
        v = data.get(key)
        if v is not None and (not _is_int(v) or v < 0):
            raise ReportError("%s: \"%s\": expected a non-negative integer" % (name, key))
        out[key] = v
    # The summary counts from the groups themselves, so that it always agrees
    # with what is listed; the shim may leave suppressed groups out of the
    # list, in which case only its top-level counts know about them.
    listed = [g for g in out["groups"] if not g["suppressed"]]
    hidden = [g for g in out["groups"] if g["suppressed"]]
    out["reported_bytes"] = sum(g["bytes"] for g in listed)
    out["reported_allocations"] = sum(g["count"] for g in listed)
    out["suppressed_bytes"] = max(out["suppressed_bytes"] or 0, sum(g["bytes"] for g in hidden))
    out["suppressed_allocations"] = max(out["suppressed_allocations"] or 0,
                                        sum(g["count"] for g in hidden))
    return out


# How far a reader looks for the first byte of the JSON before it decides
# the file is no report.
_HEAD_BYTES = 1 << 16
_JSON_SPACE = b" \t\r\n"


def _read_report_bytes(path):
    """The file's bytes, once its first byte past JSON's white space shows
    a JSON object or array; anything else (a trace, a binary, /dev/zero, a
    huge file by mistake) is refused from its first bytes, never read
    whole."""
    with open(path, "rb") as f:
        head = b""
        while len(head) < _HEAD_BYTES:
            piece = f.read(_HEAD_BYTES - len(head))
            if not piece:
                break
            head += piece
            if head.lstrip(_JSON_SPACE):
                break
        body = head.lstrip(_JSON_SPACE)
        if not body:
            if len(head) < _HEAD_BYTES:
                return head
            raise ReportError("%s: not a spyreshim report (only white space in its first %d "
                              "bytes): %s" % (path, _HEAD_BYTES, EXPECTED))
        if body[:1] not in (b"{", b"["):
            raise ReportError("%s: not a spyreshim report (it begins with %s): %s" % (
                path, repr(body[:8]), EXPECTED))
        return head + f.read()


def load(path):
    """Reads and validates one report file."""
    try:
        raw = _read_report_bytes(path)
    except OSError as e:
        raise ReportError("cannot read %s: %s" % (path, e.strerror or e))
    # Imported here: `spyreshim run` imports this module (its option types)
    # and reads no report; json costs every launch 3 ms of CPU.
    import json
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ReportError("%s: not UTF-8 (byte %d)" % (path, e.start))
    except RecursionError:
        raise ReportError("%s: not valid JSON (nested too deeply)" % path)
    except ValueError as e:
        if not raw.strip():
            raise ReportError("%s: empty file (did the process exit before writing it?)" % path)
        raise ReportError("%s: not valid JSON (%s)" % (path, e))
    return parse(data, path)


# ------------------------------------------------------------------- merging

def frame_key(f):
    """Identity of a frame across processes: load addresses differ between
    pids (ASLR), object and offset do not."""
    return (f["kind"], f["function"], f["file"], f["line"], f["object"],
            None if f["function"] or f["file"] else f["offset"])


def merge(reports):
    """One merged view of one or more reports: groups with identical frames
    (and runtime) are summed; each group lists the pids it came from."""
    merged = {}
    order = []
    for r in reports:
        for g in r["groups"]:
            key = (g["runtime"], g["suppressed"], tuple(frame_key(f) for f in g["frames"]))
            m = merged.get(key)
            if m is None:
                m = merged[key] = {
                    "bytes": 0, "count": 0, "runtime": g["runtime"],
                    "suppressed": g["suppressed"], "frames": g["frames"], "pids": [],
                    "order": g.get("order"), "unspliced": g.get("unspliced"),
                }
                order.append(key)
            m["bytes"] += g["bytes"]
            m["count"] += g["count"]
            if r["pid"] is not None and r["pid"] not in m["pids"]:
                m["pids"].append(r["pid"])
    groups = [merged[k] for k in order]
    # Stable: ties keep the order of the files, then of the groups in them.
    groups.sort(key=lambda g: (-g["bytes"], -g["count"]))
    return {
        "reports": reports,
        "pids": [r["pid"] for r in reports if r["pid"] is not None],
        "groups": groups,
        "reported_bytes": sum(r["reported_bytes"] for r in reports),
        "reported_allocations": sum(r["reported_allocations"] for r in reports),
        "suppressed_bytes": sum(r["suppressed_bytes"] for r in reports),
        "suppressed_allocations": sum(r["suppressed_allocations"] for r in reports),
    }


# ---------------------------------------------------------------------- text

NATIVE_FRAMES = ("folded", "all")


def visible_frames(g, native_frames="folded"):
    """The frames a reader sees, innermost first: with "folded" (the
    default), the interpreter's own native frames the shim marked folded
    (between Python frames, and below the outermost one down to the
    program's entry) are left out, and each run of a library's frames
    between the allocation and the user's code is one frame named after
    the library (frames.fold: "[libtorch_cpu.so: 22 frames]"); "all" keeps
    every frame."""
    if native_frames == "all":
        return list(g["frames"])
    shown = [f for f in g["frames"] if not f.get("folded")]
    # "interpreter": the interpreter's frames folded only (the pytest
    # plugin's failure text, which trims to the test function itself).
    return shown if native_frames == "interpreter" else frames_mod.fold(shown)


def _interpreter_folded(g):
    return sum(1 for f in g["frames"] if f.get("folded"))


def frame_label(f):
    """Short name for a flame-graph box (control characters escaped)."""
    if f["kind"] == "library":
        return _t(f["function"])
    if f["kind"] == "python":
        name = _t(f["function"]) or "<unknown>"
        if f["file"]:
            base = _t(f["file"].rsplit("/", 1)[-1])
            return "%s (%s:%s)" % (name, base, f["line"] or "?")
        return name
    if f["function"]:
        return _t(f["function"])
    if f["object"]:
        return "%s+%s" % (_t(f["object"].rsplit("/", 1)[-1]), _t(f["offset"]) or "?")
    return _t(f["address"]) or "??"


def frame_text(f, address=True):
    """One frame as the shim prints it (LeakSanitizer's layout), without the
    '#n' prefix; names with control characters escaped (escape.py).
    `address` False leaves out the load address (meaningless for a group
    merged from several processes)."""
    if f["kind"] == "library":
        return _t(f["function"])
    if f["kind"] == "python":
        where = _t(f["file"]) or "<unknown>"
        if f["line"]:
            where += ":%d" % f["line"]
        return "in %s %s [python]" % (_t(f["function"]) or "<unknown>", where)
    parts = []
    if f["address"] and address:
        parts.append(_t(f["address"]))
    if f["function"]:
        parts.append("in %s" % _t(f["function"]))
    if f["file"]:
        parts.append("%s:%d" % (_t(f["file"]), f["line"]) if f["line"] else _t(f["file"]))
    if f["object"]:
        parts.append("(%s+%s)" % (_t(f["object"]), _t(f["offset"]) or "?"))
    return " ".join(parts) or "<unknown frame>"


def _plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def leaks(merged):
    """At exit what is live is a leak; on OOM or in a snapshot it is not."""
    return all(r["reason"] == "exit" for r in merged["reports"])


def group_text(g, leaks=True, show_pids=False, native_frames="folded", head=None):
    """A group's head line and its frames; `head` replaces the head line
    (a failed request's, cross-rank report)."""
    lines = []
    if head is None:
        if g["suppressed"]:
            what = "Suppressed:"
        else:
            what = "Leak of" if leaks else "Live:"
        head = "%s %s in %d allocation(s) of %s memory" % (
            what, format_size(g["bytes"]), g["count"], _t(g["runtime"]))
        if show_pids and g.get("pids"):
            head += " in pid%s %s" % ("" if len(g["pids"]) == 1 else "s",
                                      ", ".join(str(p) for p in g["pids"]))
        head += ", allocated from:"
    lines.append(head)
    one_process = len(g.get("pids", ())) <= 1
    frames = visible_frames(g, native_frames)
    for i, f in enumerate(frames):
        lines.append("    #%d %s" % (i, frame_text(f, address=one_process)))
    if not g["frames"]:
        lines.append("    <no stack recorded>")
    folded = _interpreter_folded(g) if native_frames != "all" else 0
    if folded:
        lines.append("    (%d interpreter frame%s folded; --native-frames=all shows them)"
                     % (folded, "" if folded == 1 else "s"))
    if g.get("order") == "python-first":
        lines.append("    (unspliced, Python frames first: %s)" % (_t(g.get("unspliced")) or "?"))
    if g.get("order") == "origin":
        lines.append("    (a thread without Python frames; the Python frames are the call that "
                     "started its work)")
    return "\n".join(lines)


def site_label(g):
    """A site in one line: its innermost frame in the user's own code
    (frames.first_user), else its innermost frame with a name outside the
    libraries, else its innermost frame (as callorder.label names a
    trace's sites)."""
    return label_of([f for f in g["frames"] if not f.get("folded")]) or "<no stack recorded>"


def short_label(f):
    """frame_label without a C++ function's parameter list (a label's
    "via" part, a site named by the framework's frame)."""
    out = frame_label(f)
    if f["kind"] != "python" and f["function"] and "(" in out:
        depth = 0
        for i, c in enumerate(out):
            if c == "<":
                depth += 1
            elif c == ">":
                depth -= 1
            elif c == "(" and depth == 0 and i and not out[:i].endswith("operator"):
                return out[:i]
    return out


def label_of(frames):
    """The label of a site whose visible frames (innermost first) are
    `frames`: the user's innermost frame (a native one with the user's
    innermost Python frame that called it); where the stack has none (a
    thread of the framework's own, such as PyTorch's autograd worker), the
    innermost named frame with ", in <library>" when that is a library's;
    None for no frames."""
    if not frames:
        return None
    user = frames_mod.first_user(frames)
    if user is not None:
        out = frame_label(user)
        if user["kind"] != "python":
            # The user's native code, called from the user's Python: both
            # ("Tensor_new, from mlp (train.py:5)").
            at = frames.index(user)
            py = next((f for f in frames[at + 1:] if f["kind"] == "python"
                       and frames_mod.is_user(f)), None)
            if py is not None:
                out += ", from " + frame_label(py)
        return out
    first = next((f for f in frames if f["function"]), frames[0])
    lib = frames_mod.library(first)
    out = short_label(first)
    return out if not lib or lib in out else "%s (%s)" % (out, _t(lib))


def _pct(a, b):
    return 100.0 if b == 0 else 100.0 * min(a, b) / b


def collections_text(r, top=0, show_pid=False, native_frames="folded"):
    """The "collections" section of report `r` as text lines: per
    collection run for a pressure event, the bytes it freed by allocation
    site, then the cycles that held device memory."""
    c = r["collections"]
    top = top or 10
    sites = c["sites"]
    w = ["Collections run under memory pressure%s: %d; freed %s, attributed to allocation "
         "sites %s (%.1f%%); the shim's cost %.3f ms" % (
             " (pid %s)" % r["pid"] if show_pid else "", c["count"], format_size(c["freed"]),
             format_size(c["attributed"]), _pct(c["attributed"], c["freed"]),
             c["cost_ns"] / 1e6)]
    for j, run in enumerate(c["runs"]):
        w.append("  #%d at %.3f s (%.1f ms): freed %s in %d block(s), %.1f%% attributed, "
                 "%d site(s)" % (j + 1, run["at_ns"] / 1e9, run["duration_ns"] / 1e6,
                                 format_size(run["freed"]), run["blocks"],
                                 _pct(run["attributed"], run["freed"]), len(run["sites"])))
        items = sorted(run["sites"], key=lambda t: -t[1])
        for k, b, n in items[:top]:
            w.append("    %24s in %5d block(s)  %s" % (format_size(b), n, site_label(sites[k])))
        if len(items) > top:
            rest = items[top:]
            w.append("    %24s in %5d block(s)  (%d more sites)" % (
                format_size(sum(t[1] for t in rest)), sum(t[2] for t in rest), len(rest)))
    if c["runs_dropped"]:
        w.append("  (%d later collection(s) not listed; counted above and below)"
                 % c["runs_dropped"])
    if sites:
        w.append("The cycles that held device memory (sites whose blocks collections freed):")
        for g in sites[:top]:
            w.append("  %24s in %6d block(s) over %d collection(s) of %s memory, allocated from:"
                     % (format_size(g["bytes"]), g["count"], g["collections"], _t(g["runtime"])))
            for i, f in enumerate(visible_frames(g, native_frames)):
                w.append("      #%d %s" % (i, frame_text(f, address=not show_pid)))
        if len(sites) > top:
            w.append("  ... and %d more site(s) (--top)" % (len(sites) - top))
    return w


def text(merged, top=0, show_suppressed=False, native_frames="folded"):
    """The shim's text report (LeakSanitizer's layout) of a merged view."""
    reports = merged["reports"]
    is_leak = leaks(merged)
    groups = [g for g in merged["groups"] if show_suppressed or not g["suppressed"]]
    live = [g for g in groups if not g["suppressed"]]
    if is_leak and live:
        headline = "ERROR: spyreshim: detected device memory leaks"
    elif is_leak:
        headline = "spyreshim: no device memory leaks"
    else:
        reasons = sorted(set(REASONS.get(r["reason"], "(%s)" % r["reason"]) for r in reports))
        headline = "spyreshim: live device memory %s" % _t(" / ".join(reasons))
    pids = [str(r["pid"]) for r in reports if r["pid"] is not None]
    out = ["=" * 65, "==%s==%s" % (",".join(pids) or "?", headline)]
    if len(reports) > 1:
        out.append("(merged from %d reports: identical stacks summed)" % len(reports))
    elif reports[0]["exe"]:
        out.append("(%s)" % _t(reports[0]["exe"]))
    for note in sorted(set(r["python_note"] for r in reports if r.get("python_note"))):
        out.append("(%s)" % _t(note))
    shown = groups[:top] if top and top > 0 else groups
    for g in shown:
        out.append("")
        out.append(group_text(g, leaks=is_leak, show_pids=len(reports) > 1,
                              native_frames=native_frames))
    rest = groups[len(shown):]
    if rest:
        out.append("")
        out.append("... and %d more group(s): %s in %d allocation(s) (--top %d)" % (
            len(rest), format_size(sum(g["bytes"] for g in rest)), sum(g["count"] for g in rest), top))
    if merged["suppressed_allocations"]:
        out.append("")
        out.append("Suppressed: %s in %d allocation(s) matched suppressions." % (
            format_size(merged["suppressed_bytes"]), merged["suppressed_allocations"]))
    for r in reports:
        if r.get("collections"):
            out.append("")
            out.extend(collections_text(r, top=top, show_pid=len(reports) > 1,
                                        native_frames=native_frames))
    out.append("")
    out.append("SUMMARY: spyreshim: %s %s in %d allocation(s)." % (
        format_size(merged["reported_bytes"]), "leaked" if is_leak else "live", merged["reported_allocations"]))
    return "\n".join(out) + "\n"
