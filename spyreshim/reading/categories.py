"""What a device block is for, from its stacks: PyTorch's memory
categories (torch.profiler._memory_profiler.Category: PARAMETER,
OPTIMIZER_STATE, INPUT, TEMPORARY, ACTIVATION, GRADIENT, AUTOGRAD_DETAIL,
and None, shown "unknown", for a block without a stack), the breakdown of
a live set by category, and PyTorch's raw memory-timeline export
(`profile.export_memory_timeline("OUT.raw.json.gz")`), which Holistic Trace
Analysis' MemoryAnalysis reads.

Owns the classification and that export only: the trace's replay is
trace.py's, the views that show the breakdown are tracepeak.py's. A
block's category is decided by its allocation site (trace.frames: Python
and native frames): the first rule whose regular expression is found in
one of its frames' texts (frame_text) names it; the user's rules
(`--categories rules.toml`) come before the built-in ones (RULES); a
stack no rule matches is TEMPORARY. PyTorch's profiler decides by data
flow instead; from stacks and lifetimes (Lifetimes: one pass over the
trace before the views'), a block a module's forward made is an
ACTIVATION when it is still live as a backward begins (backward may read
it), else TEMPORARY; one the autograd engine made is a GRADIENT when it
outlives its backward (it became a .grad), else AUTOGRAD_DETAIL. A user's
rule names its category outright. Stdlib only; never imports torch.
"""

import gzip
import itertools
import json
import re

from . import report as rpt
from . import trace as tr

# PyTorch's Category enum, by name (its values: enum.auto(), from 1).
NAMES = ("INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT", "AUTOGRAD_DETAIL",
         "PARAMETER", "OPTIMIZER_STATE")
UNKNOWN = None
# The raw export's category numbers: _memory_profiler's _CATEGORY_TO_INDEX
# (the order of its _CATEGORY_TO_COLORS, None last), which HTA's
# memory_analysis copies as its own colour table's order.
INDEX = {"PARAMETER": 0, "OPTIMIZER_STATE": 1, "INPUT": 2, "TEMPORARY": 3,
         "ACTIVATION": 4, "GRADIENT": 5, "AUTOGRAD_DETAIL": 6, None: 7}
# The raw export's actions: _memory_profiler.Action's values.
PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY = 1, 2, 3, 4
# The order the views list categories in: the export's.
ORDER = sorted(INDEX, key=INDEX.get)

# The built-in rules, in order (the first that matches wins): (category,
# regular expression searched in each frame's text, frame_text[, INNERMOST:
# in the innermost Python frame's only]). Python frames' functions are
# qualified names (Adam._init_group); native ones are demangled C++.
INNERMOST = "innermost Python frame"
_TORCH = r"\S*/torch/"
RULES = [
    # An optimizer's state, made at its first step (Adam's exp_avg,
    # Adadelta's square_avg: _init_group from PyTorch 2.0, the step itself
    # before, where the update is in functions it calls; SGD's momentum
    # buffer: cloned in its update functions; Adagrad's sum: its
    # constructor).
    ("OPTIMIZER_STATE", r"^(\w+\.)?_init_group " + _TORCH + r"optim/"),
    ("OPTIMIZER_STATE", r"^\w+\.step " + _TORCH + r"optim/", INNERMOST),
    ("OPTIMIZER_STATE", r"^_(single|multi)_tensor_sgd " + _TORCH + r"optim/sgd\.py:"),
    ("OPTIMIZER_STATE", r"^(\w+\.)?__init__ " + _TORCH + r"optim/"),
    # Parameters: a module built on the device (its constructor, its
    # initialisation, a lazy module's first call) or moved there
    # (Module.to, .cuda(): Module._apply).
    ("PARAMETER", r"^(\w+\.)?_apply " + _TORCH + r"nn/modules/module\.py:"),
    ("PARAMETER", r"^(\w+\.)?(__init__|reset_parameters|initialize_parameters) "
     + _TORCH + r"nn/modules/"),
    ("PARAMETER", r"^\S+ " + _TORCH + r"nn/(init|parameter)\.py:"),
    # Activations: what a module's forward made (nn.Module's call), a
    # checkpoint's recomputation included.
    ("ACTIVATION", r"^(\w+\.)?(_call_impl|_wrapped_call_impl) " + _TORCH
     + r"nn/modules/module\.py:"),
    # Gradients: the autograd engine (its own device thread, or the
    # caller's) and backward()'s initial gradient.
    ("GRADIENT", r"^torch::autograd::Engine::"),
    ("GRADIENT", r"^(\w+\.)?(backward|grad|_engine_run_backward) " + _TORCH
     + r"(autograd/|_tensor\.py:)"),
    # Inputs: a tensor Python copied to the device (Tensor.to, .cuda(),
    # torch.tensor(..., device=), torch.as_tensor) outside the cases above;
    # an operator's own copies (_to_copy under a kernel, a device's CPU
    # fallback) are not.
    ("INPUT", r"^torch::autograd::(THPVariable_(to|cuda|type)|dispatch_to)\("),
    # (Debian's 1.13 leaves those static functions unnamed: the binding
    # library's own call of Tensor::to)
    ("INPUT", r"^at::Tensor::(to|cuda)\(.* \S*/libtorch_python\.so[.\d]*$"),
    ("INPUT", r"^torch::utils::(\w+::)*(tensor_ctor|as_tensor|internal_new_from_data)\("),
]

# What the lifetime of a block of a built-in ACTIVATION or GRADIENT site
# can turn it into (Lifetimes): a forward's block freed before any
# backward began, an engine's block freed within its own backward.
REFINED = {"ACTIVATION": "TEMPORARY", "GRADIENT": "AUTOGRAD_DETAIL"}
# The autograd engine's own frames (not backward()'s Python ones): a
# backward's first block without them is its initial gradient
# (_make_grads' ones), which backward() holds until it returns.
_ENGINE = re.compile(r"^torch::autograd::Engine::")


class RulesError(Exception):
    """A rules file that cannot be used: one line saying why."""


def category_name(name, where):
    """A category as the user wrote it: PyTorch's name (any case, '-' or
    ' ' for '_'), or 'unknown'."""
    n = re.sub(r"[\s-]", "_", str(name).strip()).upper()
    if n in NAMES:
        return n
    if n in ("UNKNOWN", "NONE"):
        return None
    raise RulesError("%s: %r is not a category (%s, or unknown)" % (
        where, name, ", ".join(NAMES)))


def load_rules(path):
    """The rules of a TOML file: `rules = [["REGEX", "CATEGORY"], ...]`,
    in order. RulesError on anything else."""
    try:
        import tomllib
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            raise RulesError("%s: reading TOML needs Python 3.11 (tomllib) or the tomli "
                             "package" % path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise RulesError("cannot read %s: %s" % (path, e.strerror or e))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise RulesError("%s: not TOML: %s" % (path, e))
    rules = data.get("rules")
    if not isinstance(rules, list):
        raise RulesError('%s: no `rules = [["REGEX", "CATEGORY"], ...]` list' % path)
    unknown = sorted(set(data) - {"rules"})
    if unknown:
        raise RulesError("%s: unknown key %s (only `rules`)" % (path, unknown[0]))
    out = []
    for i, r in enumerate(rules):
        where = "%s: rule %d" % (path, i + 1)
        if (not isinstance(r, list) or len(r) != 2 or not isinstance(r[0], str)
                or not isinstance(r[1], str)):
            raise RulesError('%s: not ["REGEX", "CATEGORY"]' % where)
        out.append((category_name(r[1], where), _compile(r[0], where), False))
    return out


def _compile(pattern, where):
    try:
        return re.compile(pattern)
    except re.error as e:
        raise RulesError("%s: bad regular expression %r: %s" % (where, pattern, e))


_BUILTIN = [(r[0], re.compile(r[1]), r[2:] == (INNERMOST,)) for r in RULES]
# A backward is running while the stack holds one of these frames (the
# GRADIENT rules', whatever rule names the block).
_BACKWARD = [rx for c, rx, _inner in _BUILTIN if c == "GRADIENT"]


def frame_text(f):
    """What a rule's regular expression is searched in: 'FUNCTION
    FILE:LINE' for a Python frame, 'FUNCTION FILE:LINE OBJECT' for a
    native one (the parts the trace has)."""
    parts = [f["function"] or "??"]
    if f["file"]:
        parts.append("%s:%s" % (f["file"], f["line"] or "?") if f["line"] else f["file"])
    if f["kind"] != "python" and f["object"]:
        parts.append(f["object"])
    return " ".join(parts)


class Classifier(object):
    """Sites of a trace to categories: one decision a site, each distinct
    frame searched once (sites share most of their frames: the rules'
    matches are kept by frame text, as a bit mask)."""

    def __init__(self, t, rules=()):
        self.t = t
        self.rules = list(rules) + _BUILTIN
        self._nuser = len(self.rules) - len(_BUILTIN)
        self._of = {}
        self._how = {}      # site -> Lifetimes' flags (site_flags)
        self._life = None
        self._mask = {}     # frame text -> bit i set where rule i matches it
        self._any = 0       # bits of the rules that look at every frame
        for i, (_c, _rx, innermost) in enumerate(self.rules):
            if not innermost:
                self._any |= 1 << i

    def _matches(self, text):
        m = self._mask.get(text)
        if m is None:
            m = 0
            for i, (_c, rx, _inner) in enumerate(self.rules):
                if rx.search(text):
                    m |= 1 << i
            self._mask[text] = m
        return m

    def site(self, s):
        c = self._of.get(s, 0)
        if c != 0:
            return c
        frames = self.t.frames(s)
        c = UNKNOWN
        if frames:
            hit = 0
            inner = True
            for f in frames:
                m = self._matches(frame_text(f))
                if inner and f["kind"] == "python":
                    hit |= m            # the innermost Python frame: every rule
                    inner = False
                else:
                    hit |= m & self._any
            c = self.rules[(hit & -hit).bit_length() - 1][0] if hit else "TEMPORARY"
        self._of[s] = c
        return c

    def site_flags(self, s):
        """Lifetimes' view of site s: FORWARD (a built-in ACTIVATION: its
        lifetime decides), ENGINE (a built-in GRADIENT: likewise),
        BACKWARD (its stack is in a backward: a GRADIENT rule's frame),
        NO_ENGINE (none of the engine's own frames); 0 for no stack."""
        f = self._how.get(s)
        if f is not None:
            return f
        c = self.site(s)
        f = 0
        frames = self.t.frames(s)
        if frames:
            texts = [frame_text(x) for x in frames]
            builtin = True
            if self._nuser:
                # the first user rule found wins over any built-in one
                hit = 0
                for x in texts:
                    hit |= self._matches(x) & ((1 << self._nuser) - 1)
                builtin = not hit
            if builtin and c == "ACTIVATION":
                f |= FORWARD
            elif builtin and c == "GRADIENT":
                f |= ENGINE
            if any(rx.search(x) for x in texts for rx in _BACKWARD):
                f |= BACKWARD
            if not any(_ENGINE.search(x) for x in texts):
                f |= NO_ENGINE
        self._how[s] = f
        return f

    def lifetimes(self):
        """The trace's Lifetimes (one pass, the first time it is asked)."""
        if self._life is None:
            self._life = Lifetimes(self)
        return self._life

    def block(self, s, index):
        """The category of the block of site s allocated (or freed) at
        event `index`: its site's, or what its lifetime made of it."""
        c = self.site(s)
        if c in REFINED and self.site_flags(s) & REFINE and self.lifetimes().other(index):
            return REFINED[c]
        return c


FORWARD, ENGINE, BACKWARD, NO_ENGINE = 1, 2, 4, 8
REFINE = FORWARD | ENGINE


class Lifetimes(object):
    """Which blocks of forward and engine sites their lifetimes turn
    into TEMPORARY or AUTOGRAD_DETAIL, from one pass over the trace.

    A backward begins at an allocation of the served devices whose stack
    is in one (BACKWARD) and lasts while the served devices' allocations
    are; it ends at the next other allocation, or earlier where its first
    block is its initial gradient (NO_ENGINE: made by backward() itself)
    as that block is freed, which happens as backward() returns (an
    optimizer step that allocates nothing, then zero_grad() freeing the
    gradients, stays out of it). A forward site's block still live as a
    backward begins is an ACTIVATION (a forward's block allocated inside
    a backward, a checkpoint's recomputation, too), the others TEMPORARY
    (freed first, or no backward followed); an engine's block freed
    before its backward ended is AUTOGRAD_DETAIL, the others GRADIENT.

    Memory: the forward and engine blocks live at a time, and one bit an
    event (`bits`: set at the allocation and the free of a block that
    takes the other category), so the views' streaming passes class a
    free as its allocation. Both paths (numpy, not) give the same bits:
    numpy only drops the events that change nothing first."""

    def __init__(self, cl):
        self.bits = bytearray()
        t = cl.t
        flags = {s: cl.site_flags(s) for s in t.sites}
        if not any(f & REFINE for f in flags.values()):
            return      # nothing to refine: no pass
        self._run(t, flags)

    def other(self, index):
        i = index >> 3
        return i < len(self.bits) and self.bits[i] >> (index & 7) & 1

    def _set(self, index):
        i = index >> 3
        if i >= len(self.bits):
            self.bits.extend(bytes(i + 1 - len(self.bits) + (len(self.bits) >> 1)))
        self.bits[i] |= 1 << (index & 7)

    def _run(self, t, flags):
        fwd = {}            # (dev, addr) -> allocation index: a forward's live blocks
        eng = {}            # (dev, addr) -> allocation index: this backward's
        st = [False, None, False]   # in a backward; its initial gradient; prev served alloc in one
        get = flags.get
        for b in t.batches():
            for i, k, d, a, s in self._events(b, flags, st):
                f = get(s, 0)
                if k == tr.ALLOC:
                    if _KEEP_DEV[d]:
                        if f & BACKWARD:
                            if not st[0]:
                                st[0] = True
                                fwd.clear()     # live as it begins: activations
                                st[1] = (d, a) if f & NO_ENGINE else None
                        elif st[0]:
                            st[0] = False
                            eng.clear()         # outlived it: gradients
                    if f & FORWARD and not st[0]:
                        fwd[(d, a)] = i
                    elif f & ENGINE and st[0]:
                        eng[(d, a)] = i
                elif k == tr.FREE:
                    key = (d, a)
                    j = fwd.pop(key, None)
                    if j is None and st[0]:
                        j = eng.pop(key, None)
                    if j is not None:
                        self._set(j)
                        self._set(i)
                    if st[0] and key == st[1]:
                        st[0] = False           # backward() returned
                        eng.clear()
        for j in fwd.values():                  # no backward followed
            self._set(j)

    @staticmethod
    def _events(b, flags, st):
        """(index, kind, dev, addr, site) of the batch's allocations and
        frees; with numpy, only those that can change the state: the
        forward's and engine's, the backward's, and a served allocation
        right after one in a backward (it ends it). st[2] carries whether
        the last served allocation was in a backward across batches."""
        if tr.np is None:
            return zip(itertools.count(b.start), b.kind, b.dev, b.addr, b.site)
        np = tr.np
        _seq, addr, _size, kind, dev, _tm, site = b.nd()
        us, inv = np.unique(site, return_inverse=True)
        fl = np.array([flags.get(x, 0) for x in us.tolist()], dtype=np.uint8)[inv]
        isa = kind == tr.ALLOC
        af = isa | (kind == tr.FREE)
        keep = af & ((fl & (REFINE | BACKWARD)) != 0)
        sa = np.flatnonzero(isa & _KEEP_DEV_NP[dev])
        if len(sa):
            inb = (fl[sa] & BACKWARD) != 0
            prev = np.empty(len(sa), dtype=bool)
            prev[0] = st[2]
            prev[1:] = inb[:-1]
            keep[sa[prev & ~inb]] = True
            st[2] = bool(inb[-1])
        at = np.flatnonzero(keep)
        return zip((at + b.start).tolist(), kind[at].tolist(), dev[at].tolist(),
                   addr[at].tolist(), site[at].tolist())


def breakdown(cl, live, served=True):
    """{category: bytes} of a live set ({(dev, addr): (size, site, index)},
    trace.live_sets); `served`: the pass-through pseudo-devices left out,
    as the overall peak leaves them (not a pseudo-device's own peak)."""
    out = {}
    for (d, _a), (size, site, i) in live.items():
        if served and d in tr.PASSTHROUGH_DEVICES:
            continue
        c = cl.block(site, i)
        out[c] = out.get(c, 0) + size
    return out


def breakdown_lines(by, indent="\t"):
    """The breakdown as lines, in the export's order, the empty ones left
    out: 'ACTIVATION  1258291 B (1.2 MiB), 40.0%' (sizes as units.py writes them)."""
    total = sum(by.values())
    out = []
    for c in ORDER:
        v = by.get(c, 0)
        if v:
            out.append("%s%-16s %24s, %5.1f%%" % (
                indent, c or "unknown", rpt.format_size(v), 100.0 * v / total))
    return out


# Which kinds and devices the export keeps: allocations and frees of the
# served devices (not the pass-through pseudo-devices, not "none").
_KEEP_DEV = bytes(0 if d in tr.PASSTHROUGH_DEVICES or d == tr.DEVICE_NONE else 1
                  for d in range(256))
if tr.np is not None:
    _KEEP_DEV_NP = tr.np.frombuffer(_KEEP_DEV, dtype=tr.np.uint8).astype(bool)


def timeline_rows(t, cl):
    """PyTorch's raw memory-timeline events of the trace's served devices
    together (the pass-through pseudo-devices left out, as in the overall
    peak), batch by batch in the allocator's order: lists of [time in ns
    on the Unix epoch, action, bytes (negative for a DESTROY), category
    index]. A free carries its allocation's site and size (the trace's
    layout), and Lifetimes marks a free as its allocation, so each event
    is classed alone."""
    base = t.start_realtime_ns
    life = cl.lifetimes()
    site_of = cl.site
    refine = {}         # site -> its category's refined index, or None
    for s in t.sites:
        c = site_of(s)
        refine[s] = INDEX[REFINED[c]] if c in REFINED and cl.site_flags(s) & REFINE else None
    for b in t.batches():
        if tr.np is not None:
            yield _rows_np(tr.np, b, base, site_of, refine, life)
            continue
        rows = []
        other = life.other
        for i, k, d, s, tm, st in zip(itertools.count(b.start), b.kind, b.dev, b.size, b.time,
                                      b.site):
            if (k == tr.ALLOC or k == tr.FREE) and _KEEP_DEV[d]:
                c = INDEX[site_of(st)]
                if refine.get(st) is not None and other(i):
                    c = refine[st]
                if k == tr.ALLOC:
                    rows.append([base + tm, CREATE, s, c])
                else:
                    rows.append([base + tm, DESTROY, -s, c])
        yield rows


def _rows_np(np, b, base, site_of, refine, life):
    _seq, _addr, size, kind, dev, tm, site = b.nd()
    isa = kind == tr.ALLOC
    at = np.flatnonzero((isa | (kind == tr.FREE)) & _KEEP_DEV_NP[dev])
    if not len(at):
        return []
    isa = isa[at]
    us, inv = np.unique(site[at], return_inverse=True)
    ul = us.tolist()
    cat = np.array([INDEX[site_of(s)] for s in ul], dtype=np.int64)[inv]
    alt = [refine.get(s) for s in ul]
    if life.bits and any(x is not None for x in alt):
        # the events of refined sites whose lifetime bit is set
        bits = np.frombuffer(bytes(life.bits), dtype=np.uint8)
        idx = at + b.start
        byte = idx >> 3
        inb = byte < len(bits)
        on = np.zeros(len(at), dtype=bool)
        on[inb] = (bits[byte[inb]] >> (idx[inb] & 7).astype(np.uint8)) & 1 == 1
        altc = np.array([-1 if x is None else x for x in alt], dtype=np.int64)[inv]
        sel = on & (altc >= 0)
        cat[sel] = altc[sel]
    sz = size[at].astype(np.int64)
    out = np.empty((len(at), 4), dtype=np.int64)
    out[:, 0] = tm[at].astype(np.int64) + base
    out[:, 1] = np.where(isa, CREATE, DESTROY)
    out[:, 2] = np.where(isa, sz, -sz)
    out[:, 3] = cat
    return out.tolist()


def write_timeline(t, path, cl):
    """Writes the raw export to path, streaming, gzip-compressed JSON as
    PyTorch writes OUT.raw.json.gz (HTA's MemoryAnalysis opens it with
    gzip); a path that does not end in .gz gets plain JSON. Returns the
    number of events."""
    n = 0
    if path.endswith(".gz"):
        # zlib's default level: 9 (gzip.open's) takes four times as long
        # for a file a tenth larger
        f = gzip.open(path, "wt", encoding="ascii", compresslevel=6)
    else:
        f = open(path, "w", encoding="ascii")
    with f:
        f.write("[")
        for rows in timeline_rows(t, cl):
            if rows:
                # json's C encoder writes the batch; its brackets dropped
                f.write((", " if n else "") + json.dumps(rows)[1:-1])
                n += len(rows)
        f.write("]")
    return n
