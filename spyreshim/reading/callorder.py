"""A trace's stacks in true call order, as the leak report shows them
(shim/leak/report.c, resolve_frames and fold): each native frame of the
interpreter's evaluation loop stands for the Python frames one call of it
ran, so the Python frames go where that frame is; the interpreter's own
native frames (between the extension and the innermost Python frame,
between Python frames, below the outermost one down to the program's start)
are marked folded, which report.visible_frames leaves out.

Owns this splice for the views of a trace (tracepeak.py, timeline.py,
memoryviz.py, gcview.py, pprof.py); reads what trace.py parsed: the symbol
records' flags (evaluation loop, interpreter's object) and the Python
stacks' entry marks (record 7). A trace without them (written before they
existed, or by a killed process, which has no names) keeps Python frames
first, with the reason in the group's "unspliced", as the leak report does.
"""

from . import report as rpt

SYMBOL_EVAL_LOOP = 1
SYMBOL_INTERPRETER = 2
PYSTACK_TRUNCATED = 1
PYSTACK_UNSURE = 2
PYSTACK_ORIGIN = 4      # the stack of the call that started a thread's work (origin.c)

EVAL_LOOP = "_PyEval_EvalFrameDefault"
PROGRAM_START = frozenset(("_start", "__libc_start_main", "__libc_start_main_impl",
                           "__libc_start_main_alias_2", "__libc_start_call_main",
                           "start_thread", "clone", "clone3", "thread_start"))


def is_eval_loop(name):
    """_PyEval_EvalFrameDefault, or one of its parts GCC split out (.cold)."""
    return bool(name) and name.startswith(EVAL_LOOP) and (
        len(name) == len(EVAL_LOOP) or name[len(EVAL_LOOP)] == ".")


def _libc_unnamed(f):
    if f["function"] or not f["object"]:
        return False
    return f["object"].rsplit("/", 1)[-1].startswith("libc.so")


def _python(fn, file, line):
    return {"kind": "python", "function": fn or None, "file": file or None, "line": line or None,
            "object": None, "address": None, "offset": None}


def _refusal(marks, npy, calls_native):
    if marks is None:
        return "the trace has no entry marks for this Python stack"
    flags, entry = marks
    if flags & PYSTACK_TRUNCATED:
        return "the Python stack was cut at the recorded depth"
    if (flags & PYSTACK_UNSURE) or len(entry) != npy or not entry[npy - 1]:
        return "which interpreter call ran which Python frame is not known"
    if sum(1 for e in entry if e) != calls_native:
        return ("the native stack does not hold one evaluation-loop frame per call entered "
                "from C (cut at SPYRESHIM_STACK_DEPTH?)")
    return None


def group(t, site):
    """{"frames", "order", "unspliced"} of a site: frames innermost first,
    each a report frame with "interpreter" and "folded"."""
    cache = t.__dict__.setdefault("_callorder", {})
    got = cache.get(site)
    if got is not None:
        return got
    ns, ps = t.sites.get(site, (0, 0))
    py = t.pystacks.get(ps)
    pyframes = [_python(fn, file, line) for fn, file, line in py] if py else []
    if ps and py is None:
        pyframes = [_python("<python stack %d: not resolved>" % ps, None, None)]
    native = []
    calls = 0
    loop_objects = set()
    flags = t.symbol_flags
    for a in t.nstacks.get(ns, ()):
        f = dict(t.native_frame(a))
        fl = flags.get(a, 0)
        if fl & SYMBOL_EVAL_LOOP and not is_eval_loop(f["function"]):
            f["function"] = EVAL_LOOP
        if is_eval_loop(f["function"]):
            calls += 1
            if f["object"]:
                loop_objects.add(f["object"])
        f["_interp"] = bool(fl & SYMBOL_INTERPRETER)
        native.append(f)
    for f in native:
        f["interpreter"] = f.pop("_interp") or (f["object"] in loop_objects if f["object"] else False)
        f["folded"] = False
    order = ("hybrid" if native else "python") if pyframes else "native"
    unspliced = None
    marks = t.pymarks.get(ps) if py else None
    if pyframes and marks is not None and marks[0] & PYSTACK_ORIGIN:
        order = "origin"        # the thread's own frames, then the call that started them
        for f in pyframes:
            f["origin"] = True
    elif pyframes and native:
        unspliced = _refusal(t.pymarks.get(ps) if py else None, len(pyframes), calls)
        if unspliced:
            order = "python-first"
    for f in pyframes:
        f["interpreter"] = False
        f["folded"] = False
    if order == "origin":
        frames = native + pyframes
    elif order != "hybrid":
        frames = pyframes + native
    else:
        entry = t.pymarks[ps][1]
        frames = []
        nxt = 0
        for f in native:
            if is_eval_loop(f["function"]):
                while nxt < len(pyframes):
                    frames.append(pyframes[nxt])
                    nxt += 1
                    if entry[nxt - 1]:
                        break
            frames.append(f)
        _fold(frames)
    got = {"frames": frames, "order": order, "unspliced": unspliced}
    cache[site] = got
    return got


def _fold(frames):
    pys = [i for i, f in enumerate(frames) if f["kind"] == "python"]
    if not pys:
        return
    outer = pys[-1]
    for i, f in enumerate(frames):
        if f["kind"] == "python":
            continue
        f["folded"] = f["interpreter"] or (i > outer and (f["function"] in PROGRAM_START or
                                                          _libc_unnamed(f)))


def frames(t, site):
    """Every frame of the site, innermost first (folded ones included)."""
    return group(t, site)["frames"]


def visible(t, site):
    """The frames a reader sees, innermost first (folded ones left out)."""
    return [f for f in frames(t, site) if not f["folded"]]


def shown(t, site, native_frames="folded"):
    """The frames a view draws, innermost first: visible() with each run of
    a library's frames folded into one (report.visible_frames, frames.py);
    native_frames "all" gives every frame."""
    return rpt.visible_frames({"frames": frames(t, site)}, native_frames)


def label(t, site):
    """One line naming a site: its innermost frame in the user's own code
    (frames.first_user: outside the interpreter, the frameworks' libraries,
    site-packages and the standard library), else its innermost named
    frame, with its library (report.label_of)."""
    out = rpt.label_of(visible(t, site)) or "[no stack recorded]"
    return out + ORIGIN_NOTE if group(t, site)["order"] == "origin" else out


# After the label of a site on a thread without Python frames, named by the
# Python call that started its work (spyreshim.origin).
ORIGIN_NOTE = ", on another thread"


def labels(t, sites):
    """{site: label} for sites listed together (`--view stats`, the
    timeline's legend): label() for each, and where several distinct
    sites read the same, each gets " via " and the frame where its stack
    last parted from the others' (walking in from the outermost frame: the
    call inside the library that made the difference, "step (loop.py:17)
    via Linear.forward (linear.py:125)", "... via
    torch::autograd::generated::MmBackward0::apply"). Sites whose stacks
    are the same to the end keep the same label."""
    sites = list(dict.fromkeys(sites))
    out = {s: label(t, s) for s in sites}
    same = {}
    for s in sites:
        same.setdefault(out[s], []).append(s)
    for base, group in same.items():
        if len(group) < 2:
            continue
        paths = {s: [rpt.short_label(f) for f in reversed(visible(t, s))] for s in group}
        todo = [(group, 0, None)]
        while todo:
            part, k, via = todo.pop()
            if len(part) == 1 or all(len(paths[s]) <= k for s in part):
                for s in part:
                    if via:
                        out[s] = "%s via %s" % (base, via)
                continue
            by = {}
            for s in part:
                by.setdefault(paths[s][k] if len(paths[s]) > k else None, []).append(s)
            for name, sub in by.items():
                todo.append((sub, k + 1, (name or via) if len(by) > 1 else via))
    return out


def live_report(t, live, reason, name=None):
    """A report (report.parse's shape) of a live set, grouped by site, so
    that report.text and flamegraph.page draw it as they draw leaks; each
    group's frames in call order (and its "order"/"unspliced" as the leak
    report's JSON has them)."""
    groups = {}
    for (d, _a), (sz, site, _i) in live.items():
        key = (d, site)
        g = groups.get(key)
        if g is None:
            sg = group(t, site)
            g = groups[key] = {"bytes": 0, "count": 0, "runtime": t.device_name(d),
                               "suppressed": False, "frames": sg["frames"],
                               "order": sg["order"], "unspliced": sg["unspliced"]}
        g["bytes"] += sz
        g["count"] += 1
    gl = sorted(groups.values(), key=lambda g: (-g["bytes"], -g["count"]))
    return {"name": name or t.path, "pid": t.pid, "exe": None, "reason": reason, "groups": gl,
            "live_bytes": sum(g["bytes"] for g in gl),
            "live_allocations": sum(g["count"] for g in gl),
            "reported_bytes": sum(g["bytes"] for g in gl),
            "reported_allocations": sum(g["count"] for g in gl),
            "suppressed_bytes": 0, "suppressed_allocations": 0}
