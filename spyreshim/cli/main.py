"""The `spyreshim` command line: `run` a program under the shim, `report`
on the JSON files it wrote.

Owns argument parsing, finding libspyreshim.so and the environment of the
child. `run` replaces itself with the command (exec), so the exit status,
signals and the pid are the program's own. Errors are one line on stderr
and exit status 2 (127/126 when the command cannot be run, as a shell),
never a traceback.
"""

import argparse
import glob
import os
import struct
import sys

from ..reading import escape
from . import launch
from ..reading import report as rpt

PROG = "spyreshim"
LIBNAME = "libspyreshim.so"
LOG_LEVELS = ("debug", "info", "warn", "off")
# `run --trace` without a file: one file per process (%p), so that a forked
# or exec'd child never finds its parent's file in use (docs/trace-format.md).
DEFAULT_TRACE = "spyreshim-%p.trace"

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _default_candidates():
    """Where the library is when this package was installed from a wheel
    (next to this file), else, in a checkout, the build folder next to it."""
    out = [os.path.join(PACKAGE_DIR, LIBNAME)]
    top = os.path.dirname(PACKAGE_DIR)
    if os.path.isfile(os.path.join(top, "meson.build")):
        out.append(os.path.join(os.environ.get("SPYRESHIM_BUILD") or os.path.join(top, "build"),
                                LIBNAME))
    return out


# Where to look for the library after $SPYRESHIM_LIB: the launcher script
# (scripts/spyreshim, a checkout or `meson install`) sets its own; the
# wheel's console script and `python -m spyreshim` keep these.
LIB_CANDIDATES = _default_candidates()
PYTHON_DIR = launch.PYTHON_DIR


class UsageError(Exception):
    def __init__(self, msg, status=2):
        Exception.__init__(self, msg)
        self.status = status


def find_library(env=None):
    """$SPYRESHIM_LIB, else the first existing candidate (build dir next to
    the script, then the installed library)."""
    env = os.environ if env is None else env
    explicit = env.get("SPYRESHIM_LIB")
    if explicit:
        if not os.path.isfile(explicit):
            raise UsageError("SPYRESHIM_LIB=%s: no such file" % explicit)
        return os.path.abspath(explicit)
    for c in LIB_CANDIDATES:
        if os.path.isfile(c):
            return os.path.abspath(c)
    looked = ", ".join(os.path.normpath(c) for c in LIB_CANDIDATES) or "nowhere"
    raise UsageError("cannot find %s (looked in: %s); build it (meson setup build && "
                     "ninja -C build) or set SPYRESHIM_LIB" % (LIBNAME, looked))


# SPYRESHIM_STACK_DEPTH's defaults are the library's, in one header
# (shim/base/stackdepth.h), installed next to this package; read here for
# --help rather than written a second time.
STACK_DEPTH_HEADERS = (os.path.join(PACKAGE_DIR, "stackdepth.h"),
                       os.path.join(os.path.dirname(PACKAGE_DIR), "shim", "base", "stackdepth.h"))


def stack_depth_defaults():
    """(native default, default once Python frames are recorded), or None
    when the header is not found."""
    import re
    for path in STACK_DEPTH_HEADERS:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        got = dict(re.findall(r"^#define SHIM_STACK_DEPTH_DEFAULT(_PYTHON)?\s+(\d+)\s*$", text,
                              re.M))
        if "" in got and "_PYTHON" in got:
            return int(got[""]), int(got["_PYTHON"])
    return None


def _stack_depth_help():
    d = stack_depth_defaults()
    default = ("default %d, %d once Python frames are recorded" % d if d else
               "default: the library's, docs/configuration.md")
    return ("native frames recorded per allocation, and Python frames at most (%s)"
            % default).replace("%", "%%")


def _version():
    from .. import __version__
    return __version__


def _size(text):
    try:
        return rpt.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))


def _exitcode(text):
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 255:
        raise argparse.ArgumentTypeError("invalid exit code %r (expected 0 to 255)" % text)
    return n


def _positive(text):
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 1:
        raise argparse.ArgumentTypeError("expected a positive integer, got %r" % text)
    return n


def _parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Run programs under libspyreshim (device-memory region allocator, "
                    "GC on out-of-memory, leak reports) and read its leak reports.")
    p.add_argument("--version", action="version", version="%(prog)s " + _version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    r = sub.add_parser(
        "run", help="run a command with libspyreshim preloaded",
        usage="%(prog)s [options] -- CMD [ARG ...]",
        description="Runs CMD with libspyreshim.so preloaded (LD_PRELOAD) and the SPYRESHIM_* "
                    "variables set from the options. The exit status is the command's "
                    "(with --leak-check and leaks at exit of a command that exits 0: "
                    "--exitcode, default 23; one that fails keeps its status). "
                    "--report, --exitcode and --suppressions imply --leak-check. "
                    "What counts as a leak: device memory still allocated at exit that was "
                    "not live when the Python interpreter began to shut down (after a "
                    "collection): allocated while shutting down and never freed, or, in a "
                    "process without Python, anything still allocated. What was live when "
                    "shutdown began is reported apart as 'held until exit', whatever held it "
                    "(a cache that grew, a model in a global, a reference an extension leaked, "
                    "a pointer native code lost: the shim cannot tell them apart), and sets "
                    "the exit status only with --leak-check=held.")
    r.add_argument("--leak-check", action="store_true",
                   help="record stacks of device allocations; report leaks at exit, and "
                        "apart what Python held until exit (--leak-check=held: that too "
                        "sets the exit status)")
    # --leak-check=held, rewritten by main() (an optional value would take
    # the command's first word after a bare --leak-check).
    r.add_argument("--leak-check-held", action="store_true", help=argparse.SUPPRESS)
    r.add_argument("--limit", type=_size, metavar="SIZE",
                   help="device bytes the shim may reserve (e.g. 512M, 2G)")
    r.add_argument("--report", metavar="FILE",
                   help="write the leak report as JSON (%%p: the pid, %%r: the rank, %%l: the local rank, %%R: the restart count, %%h: the host)")
    r.add_argument("--exitcode", type=_exitcode, metavar="N",
                   help="exit status when leaks remain at exit (default 23)")
    r.add_argument("--suppressions", metavar="FILE",
                   help="file of leak:<pattern> lines (LeakSanitizer format)")
    r.add_argument("--stack-depth", type=_positive, metavar="N", help=_stack_depth_help())
    r.add_argument("--stats", metavar="FILE", help="write the counters to FILE at exit")
    r.add_argument("--trace", metavar="FILE", nargs="?", const=DEFAULT_TRACE,
                   help="record every allocation, free, pressure event and collection with "
                        "stacks to FILE (%%p: the pid, %%r %%l %%R %%h: the rank, local rank, restart count, host; without FILE: " +
                        DEFAULT_TRACE.replace("%", "%%") + ", a file per process); "
                        "read it with `report`")
    r.add_argument("--control", action="store_true",
                   help="open the control socket, so that `spyreshim snapshot PID` can ask the "
                        "running program for its live allocations (SPYRESHIM_CONTROL=1)")
    r.add_argument("--log", choices=LOG_LEVELS, metavar="LEVEL",
                   help="shim diagnostics: " + ", ".join(LOG_LEVELS))
    r.add_argument("--preset", action="append", choices=("torch", "cupy", "numba", "jax", "rmm"),
                   metavar="NAME",
                   help="set a framework's configuration for the shim's garbage collection and "
                        "install its out-of-memory hook when it is imported: torch, cupy, numba, "
                        "jax or rmm (repeatable; docs/frameworks.md)")
    r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD")

    rep = sub.add_parser(
        "report", help="print (or draw) leak report files",
        description="Prints the LeakSanitizer-style view of one or more report files "
                    "(SPYRESHIM_REPORT); several files, one per process, are merged: groups "
                    "with identical stacks are summed and list their pids.")
    rep.add_argument("files", nargs="+", metavar="FILE",
                     help="leak reports (JSON), or one trace (SPYRESHIM_TRACE, found by its "
                          "magic); several traces, a folder or a glob: one row per rank")
    rep.add_argument("--ranks", action="store_true",
                     help="one row per process of a launch (rank): peak, reserved, headroom, "
                          "collections, OOMs; the default for several traces, a folder or a glob")
    rep.add_argument("--diff-ranks", nargs=2, metavar=("A", "B"),
                     help="what rank B held at its peak that rank A did not, by site (their "
                          "traces among the files)")
    rep.add_argument("--chrome-trace", metavar="OUT.json",
                     help="write the traces in the Trace Event Format (Perfetto, "
                          "chrome://tracing): a process per rank, counters of bytes in use and "
                          "reserved per device, collections, pressure and OOMs as instants")
    rep.add_argument("--view", choices=("peak", "timeline", "stats", "gc"), default=None,
                     help="for a trace: peak (default; what was live at the peak), timeline "
                          "(an HTML page, needs --html), stats (text) or gc (what each collection "
                          "freed, by allocation site)")
    rep.add_argument("--memory-viz", metavar="OUT.pickle",
                     help="for a trace: write the snapshot PyTorch's memory_viz page reads")
    rep.add_argument("--memory-timeline", metavar="OUT.json.gz",
                     help="for a trace: write PyTorch's raw memory timeline (torch.profiler's "
                          "export_memory_timeline to .raw.json.gz: [time ns, action, bytes, "
                          "category]), which HTA's MemoryAnalysis reads")
    rep.add_argument("--categories", metavar="RULES.toml",
                     help="for a trace: rules = [[\"REGEX\", \"CATEGORY\"], ...] classing "
                          "blocks by their frames (first match wins) before the built-in "
                          "rules (parameter, optimizer state, activation, gradient, input, "
                          "temporary; a forward's and the autograd engine's blocks by their "
                          "lifetimes: autograd detail, temporary)")
    rep.add_argument("--diff", action="store_true",
                     help="what grew between two moments and is still live: two reports or "
                          "snapshots (A B), or one trace with --at T1 --at T2 (without: from "
                          "its start to the interpreter's shutdown); from a trace, what a later "
                          "collection freed is listed apart")
    rep.add_argument("--at", action="append", metavar="T",
                     help="with --diff and a trace: a moment (\"2.5s\", an event number or "
                          "\"end\"); twice")
    rep.add_argument("--json", metavar="OUT.json", help="with --diff: write the growth as JSON")
    rep.add_argument("--pprof", metavar="OUT.pb.gz",
                     help="live bytes and counts by stack as a pprof profile: of a trace at "
                          "the peak, or at --at T (\"end\", \"2.5s\" or an event number); of "
                          "leak reports, what leaked; with --diff, what grew")
    rep.add_argument("--from", dest="first", metavar="T",
                     help="with --memory-viz: the page starts at T (\"2.5s\" since the trace "
                          "began, or an event number)")
    rep.add_argument("--to", dest="last", metavar="T",
                     help="with --memory-viz: the page ends at T (seconds or event number)")
    rep.add_argument("--html", metavar="OUT.html",
                     help="write a self-contained page with a flame graph instead of text")
    rep.add_argument("--top", type=_positive, metavar="N", default=0,
                     help="show the N largest groups only")
    rep.add_argument("--show-suppressed", action="store_true",
                     help="also list groups matched by suppressions")
    rep.add_argument("--native-frames", choices=rpt.NATIVE_FRAMES, default="folded",
                     help="folded (default): hide the interpreter's own native frames between "
                          "and below Python frames and show each run of a library's frames "
                          "(frameworks, site-packages, the C runtime) as one frame named after "
                          "it; all: show every frame")
    rep.add_argument("--fail-on-leaks", action="store_true",
                     help="exit with status 1 when unsuppressed live memory is reported")
    snap = sub.add_parser(
        "snapshot", help="write the live allocations of a running process as a leak report",
        description="Asks process PID, running under the shim with SPYRESHIM_CONTROL=1 "
                    "(`spyreshim run --control`), for its live device allocations now, and "
                    "writes them as a leak report (`spyreshim report FILE`, `report --diff A "
                    "B`). The program goes on; it is stopped only while its live records are "
                    "copied (and, for Python frames not yet named, while they are). Only the "
                    "process's own user may ask.")
    sub.add_parser(
        "doctor", help="say which runtimes, interpreters, presets and library this install sees",
        description="One screen: the library and whether it loads, the device runtimes the "
                    "loader would find, this interpreter and those the shim collects "
                    "garbage in, which --preset frameworks are importable here. Exit status "
                    "1 when the library is missing or does not load.")
    snap.add_argument("pid", type=_positive, metavar="PID")
    snap.add_argument("-o", "--output", metavar="FILE",
                      help="where to write the report (default: spyreshim-snapshot-PID.json)")
    snap.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                      help="how long to wait for the answer (default 10)")
    p.commands = {"run": r, "report": rep, "snapshot": snap}
    return p


def _squeezed(option):
    return option.lstrip("-").replace("_", "-").replace("-", "").lower()


def _meant(parser, option):
    """The option of `parser` that `option` (not one of its) most likely
    meant, or None: the same but for case, '-' and '_', else the closest
    spelling."""
    import difflib
    name = option.split("=", 1)[0]
    known = [s for a in parser._actions if a.help != argparse.SUPPRESS
             for s in a.option_strings if s.startswith("--")]
    same = [s for s in known if _squeezed(s) == _squeezed(name)]
    if same:
        return same[0]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return close[0] if close else None


def _unknown(parser, args, extra):
    """One line for arguments no option takes (argparse's "unrecognized
    arguments"), naming the option a misspelt one most likely meant."""
    sub = parser.commands.get(args.command, parser)
    words = []
    for a in extra:
        meant = _meant(sub, a) if a.startswith("--") else None
        words.append("%s (did you mean %s?)" % (a, meant) if meant else a)
    sys.stderr.write("%s: error: unrecognized arguments: %s\n" % (
        sub.prog, escape.terminal(" ".join(words))))
    return 2


def cmd_snapshot(args):
    from . import control
    out = args.output or "spyreshim-snapshot-%d.json" % args.pid
    if not args.timeout > 0:
        raise UsageError("snapshot: --timeout must be positive")
    try:
        figures, text = control.take(args.pid, args.timeout)
        control.write(out, text)
    except control.SnapshotError as e:
        raise UsageError(str(e))
    gil = figures.get("gil_ns", 0)
    sys.stderr.write("%s snapshot: wrote %s: %d live allocation%s, %s; its allocating threads "
                     "were stopped at most %.3f ms (allocator locks held %.3f ms in all)%s\n" % (
                         PROG, escape.terminal(out), figures.get("blocks", 0),
                         "" if figures.get("blocks", 0) == 1 else "s",
                         rpt.format_size(figures.get("bytes", 0)),
                         figures.get("longest_ns", 0) / 1e6, figures.get("held_ns", 0) / 1e6,
                         ", its Python threads %.3f ms (naming frames)" % (gil / 1e6) if gil
                         else ""))
    return 0


def _abs(path):
    return os.path.abspath(path) if path else path


def cmd_run(args):
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("run: no command given (usage: spyreshim run [options] -- CMD ...)")
    if args.suppressions and not os.path.isfile(args.suppressions):
        raise UsageError("run: --suppressions %s: no such file" % args.suppressions)
    lib = find_library()

    env = dict(os.environ)
    try:
        env["LD_PRELOAD"] = launch.compose_preload(lib, env.get("LD_PRELOAD"))
    except launch.PreloadError as e:
        raise UsageError("run: %s" % e)
    leak = (args.leak_check or args.leak_check_held or args.report or
            args.exitcode is not None or args.suppressions)
    settings = [
        ("SPYRESHIM_LEAK_CHECK", "held" if args.leak_check_held else "1" if leak else None),
        ("SPYRESHIM_LIMIT", str(args.limit) if args.limit is not None else None),
        ("SPYRESHIM_REPORT", _abs(args.report)),     # the program may chdir
        ("SPYRESHIM_EXITCODE", str(args.exitcode) if args.exitcode is not None else None),
        ("SPYRESHIM_SUPPRESSIONS", _abs(args.suppressions)),
        ("SPYRESHIM_STACK_DEPTH", str(args.stack_depth) if args.stack_depth else None),
        ("SPYRESHIM_STATS", _abs(args.stats)),
        ("SPYRESHIM_TRACE", _abs(args.trace)),
        # Which file each process wrote (%p, a .N suffix): one line at its exit.
        ("SPYRESHIM_TRACE_NOTE", "1" if args.trace else None),
        ("SPYRESHIM_LOG", args.log),
        ("SPYRESHIM_CONTROL", "1" if args.control else None),
    ]
    for name, value in settings:
        if value is not None:
            env[name] = value
    # So that `python -m pytest -p spyreshim.pytest_plugin` and
    # `import spyreshim` work in the child; appended, the program's own
    # path entries keep precedence.
    env["PYTHONPATH"] = launch.compose_python_path(env.get("PYTHONPATH", ""))
    if args.preset:
        from .. import presets
        presets.apply(list(dict.fromkeys(args.preset)), env)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        status = 127 if isinstance(e, FileNotFoundError) else 126
        raise UsageError("run: cannot run %s: %s" % (cmd[0], e.strerror or e), status)


def _signal_name(n):
    import signal
    try:
        return signal.Signals(n).name
    except ValueError:
        return "signal %d" % n


def cmd_trace_report(args):
    from ..reading import trace as tr
    from ..views import tracepeak
    if len(args.files) != 1:
        raise UsageError("report: one trace at a time")
    t = tr.stream(args.files[0])
    if t.truncated:
        sys.stderr.write("%s report: %s is truncated (the process did not exit); "
                         "reading what was flushed\n" % (PROG, args.files[0]))
    elif t.signal is not None:
        sys.stderr.write("%s report: %s ends where its process was ended by signal %d (%s); "
                         "reading what was flushed then\n"
                         % (PROG, args.files[0], t.signal, _signal_name(t.signal)))
    elif t.ended is False:
        sys.stderr.write("%s report: %s ends before its process's exit (killed, _exit, exec, "
                         "or recording stopped); reading what was flushed, with the names "
                         "written by its last flush\n" % (PROG, args.files[0]))
    if args.pprof:
        from ..exports import pprof
        if len(args.at or ()) > 1:
            raise UsageError("report --pprof: one --at at most")
        try:
            words, live = pprof.write(t, args.pprof, (args.at or [None])[0])
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.pprof, e.strerror or e))
        sys.stderr.write("%s report: wrote %s: %s live in %d block(s) at %s (go tool pprof "
                         "-top %s)\n" % (PROG, args.pprof,
                                          rpt.format_size(sum(v[0] for v in live.values())),
                                          len(live), words, args.pprof))
        if (not args.view and not args.html and not args.memory_viz
                and not args.memory_timeline):
            return 0
    rules = ()
    if args.categories:
        from ..reading import categories
        try:
            rules = categories.load_rules(args.categories)
        except categories.RulesError as e:
            raise UsageError("report: %s" % e)
    if args.memory_timeline:
        from ..reading import categories
        try:
            nev = categories.write_timeline(t, args.memory_timeline,
                                            categories.Classifier(t, rules))
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.memory_timeline,
                                                             e.strerror or e))
        sys.stderr.write("%s report: wrote %s: %d memory events (HTA's MemoryAnalysis "
                         "reads it)\n" % (PROG, args.memory_timeline, nev))
        if not args.view and not args.html and not args.memory_viz:
            return 0
    if (args.first is not None or args.last is not None) and not args.memory_viz:
        raise UsageError("report: --from and --to cut the --memory-viz export")
    if args.memory_viz:
        from ..exports import memoryviz
        first = memoryviz.parse_bound(args.first) if args.first is not None else None
        last = memoryviz.parse_bound(args.last) if args.last is not None else None
        try:
            nev, nseg = memoryviz.write(t, args.memory_viz, first, last)
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.memory_viz, e.strerror or e))
        sys.stderr.write("%s report: wrote %s: %d events, %d segments (drop it on "
                         "https://pytorch.org/memory_viz)\n" % (PROG, args.memory_viz, nev, nseg))
        if not args.view and not args.html:
            return 0
    view = args.view or "peak"
    if view == "gc":
        from ..views import gcview
        gcview.write(t, sys.stdout.write, top=args.top or 10, native_frames=args.native_frames)
        return 0
    if view == "stats":
        sys.stdout.write(escape.text_out(tracepeak.stats_text(t, top=args.top or 5, rules=rules)))
        return 0
    if view == "timeline" and not args.html:
        raise UsageError("report: --view timeline draws a page: give --html OUT.html")
    if args.html:
        if view == "timeline":
            from ..views import timeline
            page = timeline.page(t, native_frames=args.native_frames)
        else:
            page = tracepeak.peak_html(t, top=args.top, rules=rules,
                                       native_frames=args.native_frames)
        try:
            with open(args.html, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(page)
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.html, e.strerror or e))
        sys.stderr.write("%s report: wrote %s (%s of %d events)\n" % (PROG, args.html, view, len(t)))
        return 0
    sys.stdout.write(escape.text_out(tracepeak.peak_text(t, top=args.top, rules=rules,
                                                         native_frames=args.native_frames)))
    return 0


def _write(path, text):
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise UsageError("report: cannot write %s: %s" % (path, e.strerror or e))


def cmd_diff(args):
    from ..views import diff
    from ..reading import trace as tr
    traces = [p for p in args.files if tr.is_trace(p)]
    if traces:
        if len(args.files) != 1 or len(args.at or ()) not in (0, 2):
            raise UsageError("report --diff: one trace, with --at T1 --at T2 or without "
                             "(from its start to the interpreter's shutdown)")
        t = tr.stream(args.files[0])
        words = None
        if args.at:
            i1, i2 = sorted(tr.at_index(t, v) for v in args.at)
        else:
            i1, i2, words = diff.default_moments(t)
        r = diff.of_trace(t, i1, i2)
        title = diff.trace_title(t, args.files[0], i1, i2, words)
    else:
        if len(args.files) != 2 or args.at:
            raise UsageError("report --diff: two reports or snapshots (A B), or one trace with "
                             "--at T1 --at T2")
        a, b = (rpt.load(p) for p in args.files)
        r = diff.of_reports(a, b)
        title = "from %s to %s" % tuple(args.files)
    if args.json:
        _write(args.json, diff.to_json(r, title))
    if args.pprof:
        from ..exports import pprof
        try:
            pprof.write_report(r, args.pprof, "growth " + title)
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.pprof, e.strerror or e))
        sys.stderr.write("%s report: wrote %s: %s grew at %d site%s (go tool pprof -top %s)\n" % (
            PROG, args.pprof, rpt.format_size(r["reported_bytes"]), len(r["groups"]),
            "" if len(r["groups"]) == 1 else "s", args.pprof))
    if args.html:
        _write(args.html, diff.html(r, title))
        sys.stderr.write("%s report: wrote %s (%s grew at %d site%s)\n" % (
            PROG, args.html, rpt.format_size(r["reported_bytes"]), len(r["groups"]),
            "" if len(r["groups"]) == 1 else "s"))
    if not args.html and not args.json and not args.pprof:
        sys.stdout.write(escape.text_out(diff.text(r, title)))
    return 0


def _many(files):
    """Several processes' files: more than one trace, a folder or a glob."""
    from ..reading import trace as tr
    return (sum(1 for p in files if tr.is_trace(p)) > 1 or
            any(os.path.isdir(p) or (not os.path.exists(p) and glob.has_magic(p))
                for p in files))


def cmd_ranks(args):
    from ..views import diff
    from ..views import ranks
    rows = ranks.gather(args.files)
    if args.chrome_trace:
        from ..exports import chrometrace
        try:
            n = chrometrace.write(rows, args.chrome_trace)
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.chrome_trace,
                                                              e.strerror or e))
        sys.stderr.write("%s report: wrote %s: %d trace events of %d process%s (open it in "
                         "https://ui.perfetto.dev or chrome://tracing)\n" % (
                             PROG, args.chrome_trace, n, len(rows),
                             "" if len(rows) == 1 else "es"))
        return 0
    if args.html and not args.diff_ranks:
        from ..views import rankpage
        _write(args.html, rankpage.page(rows, top=args.top, native_frames=args.native_frames))
        sys.stderr.write("%s report: wrote %s (%d process%s on one time axis)\n" % (
            PROG, args.html, len(rows), "" if len(rows) == 1 else "es"))
        return 0
    if args.diff_ranks:
        r, title = ranks.diff_ranks(rows, *args.diff_ranks)
        sys.stdout.write(escape.text_out(diff.text(r, title)))
        return 0
    sys.stdout.write(escape.text_out(ranks.text(rows, top=args.top,
                                                 native_frames=args.native_frames)))
    return 0


def cmd_report(args):
    from ..reading import trace as tr
    if args.ranks or args.diff_ranks or args.chrome_trace or _many(args.files):
        return cmd_ranks(args)
    if args.diff:
        return cmd_diff(args)
    if args.json or (args.at and not args.pprof):
        raise UsageError("report: --at and --json go with --diff (--at also with --pprof)")
    if any(tr.is_trace(path) for path in args.files):
        return cmd_trace_report(args)
    if args.view or args.memory_viz or args.memory_timeline or args.categories:
        raise UsageError("report: --view, --memory-viz, --memory-timeline and --categories "
                         "read a trace (spyreshim run --trace)")
    reports = [rpt.load(path) for path in args.files]
    merged = rpt.merge(reports)
    if args.pprof:
        # What leaked (or was live), by stack, as heaptrack's and jeprof's
        # leak profiles: the groups the text lists.
        from ..exports import pprof
        what = "leaked" if rpt.leaks(merged) else "live"
        try:
            pprof.write_report(merged, args.pprof, "device memory %s in %s" % (
                what, ", ".join(args.files)), show_suppressed=args.show_suppressed)
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.pprof, e.strerror or e))
        ngroups = len([g for g in merged["groups"] if args.show_suppressed or not g["suppressed"]])
        sys.stderr.write("%s report: wrote %s: %s %s in %d stack%s (go tool pprof -top %s)\n" % (
            PROG, args.pprof, rpt.format_size(merged["reported_bytes"]), what, ngroups,
            "" if ngroups == 1 else "s", args.pprof))
    if args.html:
        from ..views import flamegraph
        page = flamegraph.page(merged, show_suppressed=args.show_suppressed, top=args.top,
                               native_frames=args.native_frames)
        try:
            with open(args.html, "w", encoding="utf-8", errors="backslashreplace") as f:
                f.write(page)
        except OSError as e:
            raise UsageError("report: cannot write %s: %s" % (args.html, e.strerror or e))
        ngroups = len([g for g in merged["groups"] if not g["suppressed"]])
        sys.stderr.write("%s report: wrote %s (%s live in %d stack%s from %d file%s)\n" % (
            PROG, args.html, rpt.format_size(merged["reported_bytes"]),
            ngroups, "" if ngroups == 1 else "s", len(reports), "" if len(reports) == 1 else "s"))
    elif not args.pprof:
        sys.stdout.write(escape.text_out(rpt.text(merged, top=args.top,
                                                  show_suppressed=args.show_suppressed,
                                                  native_frames=args.native_frames)))
        sys.stdout.flush()
    if args.fail_on_leaks and merged["reported_allocations"]:
        return 1
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"] and "--leak-check=held" in argv:
        end = argv.index("--") if "--" in argv else len(argv)
        argv = [("--leak-check-held" if a == "--leak-check=held" and i < end else a)
                for i, a in enumerate(argv)]
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        return _unknown(parser, args, extra)
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "snapshot":
            return cmd_snapshot(args)
        if args.command == "doctor":
            from . import doctor
            return doctor.main(LIB_CANDIDATES, PYTHON_DIR, sys.stdout.write)
        parser.print_help(sys.stderr)
        return 2
    except (UsageError, rpt.ReportError) as e:
        sys.stderr.write("%s: %s\n" % (PROG, escape.terminal(str(e))))
        return getattr(e, "status", 2)
    except BrokenPipeError:
        # `spyreshim report ... | head`: not an error of ours.
        try:
            sys.stdout = None
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        except OSError:
            pass
        return 0
    except KeyboardInterrupt:
        return 130
    except MemoryError:
        sys.stderr.write("%s: %s: out of memory reading %s\n" % (
            PROG, args.command, escape.terminal(" ".join(getattr(args, "files", [])))))
        return 2
    except RecursionError:
        sys.stderr.write("%s: %s: %s: nested too deeply\n" % (
            PROG, args.command, escape.terminal(" ".join(getattr(args, "files", [])))))
        return 2
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, AttributeError,
            ZeroDivisionError, struct.error) as e:
        # The last line of defence: the readers raise ReportError naming the
        # offset or field for every bad input they know of; anything else
        # a crafted file reaches is still one line and status 2, never a
        # traceback (tests/integration/test_trace_hostile.py fuzzes this).
        if args.command != "report":
            raise
        sys.stderr.write("%s: %s: not a readable report or trace (%s: %s)\n" % (
            PROG, escape.terminal(" ".join(args.files)), type(e).__name__,
            escape.terminal(str(e))[:200]))
        return 2
