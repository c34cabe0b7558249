"""pytest plugin: fail tests that leave device memory behind.

    spyreshim run --leak-check -- python3 -m pytest -p spyreshim.pytest_plugin --spyreshim-leaks

    @pytest.mark.limit_leaks("1 MB")
    def test_cache_may_grow_a_little(): ...

Around the call of each checked test (every test with --spyreshim-leaks,
else those marked limit_leaks): garbage is collected and a mark taken
before; after it, garbage is collected again (a few rounds, so cycles that
hold tensors are broken) and the allocations made since the mark that are
still live are grouped by stack (suppressions, `spyreshim run
--suppressions`, leave out the groups they match). With --spyreshim-leaks
alone the test fails when their sum is above --spyreshim-leak-limit (0 by
default). The marker is pytest-memray's, with its signature and meaning:
`limit_leaks(location_limit, *, filter_fn=None, current_thread_only=False)`
fails the test when one location (one stack) keeps at least
`location_limit` ("1 MB": a number, optional spaces, B/KB/MB/GB/TB/PB,
powers of 1024; ours also take 1M, 1MiB); `filter_fn(stack)` sees each
location's `stack.frames`, innermost first, each with `function`,
`filename`, `lineno`, and returns whether it counts; `current_thread_only`
counts only what the test's thread allocated (the shim keeps the
allocating thread of each block once the thread asked,
spyreshim_snapshot_take_thread).
The stacks are numbered innermost first, as in every other report.
`limit_memory(limit, *, current_thread_only=False)`, pytest-memray's
too, fails the test when its device peak (the most in use during it, above
what was in use at its start) reaches `limit`; with current_thread_only,
only the bytes the test's thread allocated count, whoever frees them
(spyreshim_thread_peak). With --fail-on-increase (pytest-memray's option:
where pytest-memray is loaded too, its option is the one flag for both) a
test marked limit_memory also fails when its device peak is above that of
its last successful run, kept in pytest's cache under
spyreshim/device_peak/<node id>. A test
that failed by itself is not checked: its traceback keeps its frames, and
so its tensors, alive.

The wheel registers the plugin by entry point, so it is loaded in every
pytest run of that environment: unless asked (--spyreshim-leaks, or a
collected test marked limit_leaks) it checks nothing and says nothing.
Asked without libspyreshim preloaded, it says so once, after collection,
and checks nothing. A marker whose limit does not parse is a usage
error at collection. Setup and teardown are outside the window, as in
pytest-memray's limit_leaks: fixtures may cache device memory.
"""

import collections

import pytest

import spyreshim
from spyreshim import report as rpt

MARKER = "limit_leaks"
MEMORY_MARKER = "limit_memory"


def pytest_addoption(parser, pluginmanager):
    group = parser.getgroup("spyreshim", "device-memory leak checks (spyreshim)")
    group.addoption("--spyreshim-leaks", action="store_true", default=False,
                    help="fail every test whose device allocations grew across it "
                         "(needs libspyreshim preloaded: spyreshim run -- ...)")
    group.addoption("--spyreshim-leak-limit", metavar="SIZE", default="0",
                    help="bytes a test may leave allocated with --spyreshim-leaks "
                         "(e.g. 1MB; default 0)")
    group.addoption("--spyreshim-gc-rounds", metavar="N", type=int, default=3,
                    help="gc.collect() rounds before measuring (default 3)")
    # --fail-on-increase is pytest-memray's option too, and both plugins
    # may be loaded in one run (each by its entry point): pytest refuses an
    # option registered twice, whichever comes second. Ours is added only
    # where pytest-memray's is not, so one flag drives both plugins, each
    # checking its own memory. pytest-memray is importable: it may register
    # after us (the order of entry points is the order of installation), so
    # ours waits until every plugin is in, pytest_load_initial_conftests;
    # unless we are loaded by a conftest's pytest_plugins, past that point.
    if _option_taken(parser, FAIL_ON_INCREASE):
        return
    if _memray_installed() and not _conftests_loading(pluginmanager):
        parser._spyreshim_fail_on_increase_pending = True
        return
    _add_fail_on_increase(parser)


FAIL_ON_INCREASE = "--fail-on-increase"
CACHE_KEY = "spyreshim/device_peak/"    # + the test's node id


def _add_fail_on_increase(parser):
    parser.getgroup("spyreshim").addoption(
        FAIL_ON_INCREASE, action="store_true", default=False, dest="fail_on_increase",
        help="fail a test marked limit_memory whose device peak is above that of its last "
             "successful run (kept in pytest's cache; pytest-memray's option, which also "
             "checks host memory where it is installed)")


def _option_taken(parser, name):
    groups = list(getattr(parser, "_groups", []))
    anonymous = getattr(parser, "_anonymous", None)
    if anonymous is not None and anonymous not in groups:
        groups.append(anonymous)
    return any(name in opt.names() for g in groups for opt in getattr(g, "options", ()))


def _conftests_loading(pluginmanager):
    """True when a conftest file is registered already (pytest registers
    each under its path)."""
    return any(isinstance(name, str) and name.endswith("conftest.py")
               for name, _ in pluginmanager.list_name_plugin())


def _memray_installed():
    import importlib.util
    try:
        return importlib.util.find_spec("pytest_memray") is not None
    except (ImportError, ValueError):
        return False


@pytest.hookimpl(hookwrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Every plugin is registered now (entry points, -p, the initial
    # conftests' pytest_plugins): pytest-memray's option is there if it is
    # loaded; ours otherwise (-p no:memray, PYTEST_DISABLE_PLUGIN_AUTOLOAD).
    yield
    if getattr(parser, "_spyreshim_fail_on_increase_pending", False):
        parser._spyreshim_fail_on_increase_pending = False
        if not _option_taken(parser, FAIL_ON_INCREASE):
            _add_fail_on_increase(parser)


class _Checker(object):
    def __init__(self, config):
        self.config = config
        self.all_tests = config.getoption("spyreshim_leaks")
        try:
            self.default_limit = rpt.parse_size(config.getoption("spyreshim_leak_limit"))
        except ValueError as e:
            raise pytest.UsageError("--spyreshim-leak-limit: %s" % e)
        self.gc_rounds = max(1, config.getoption("spyreshim_gc_rounds"))
        self.available = spyreshim.available()
        self.asked = self.all_tests   # or a collected test carries the marker
        self.results = {}     # nodeid -> failure text
        # Ours or pytest-memray's: the same dest, one flag for both.
        self.fail_on_increase = bool(config.getoption("fail_on_increase", default=False))

    def limit_for(self, item):
        """None (not checked), or (limit, per_location, filter_fn, current_thread_only)."""
        m = item.get_closest_marker(MARKER)
        if m is not None:
            return _marker_spec(item, m)
        return (self.default_limit, False, None, False) if self.all_tests else None

    def memory_limit_for(self, item):
        """None (not checked), or (limit of the test's device peak,
        current_thread_only)."""
        m = item.get_closest_marker(MEMORY_MARKER)
        return None if m is None else _memory_spec(item, m)


def _limit_memory(limit, current_thread_only=False):
    return limit, current_thread_only


def _memory_spec(item, m):
    """pytest-memray's signature: limit_memory(limit, *, current_thread_only=False)."""
    def bad(why):
        return pytest.UsageError("%s: @pytest.mark.%s: %s" % (item.nodeid, MEMORY_MARKER, why))
    if len(m.args) > 1:
        raise bad("takes one positional argument, limit")
    try:
        limit, thread_only = _limit_memory(*m.args, **m.kwargs)
    except TypeError as e:
        raise bad(str(e).replace("_limit_memory()", "limit_memory()"))
    try:
        return rpt.parse_size(limit), bool(thread_only)
    except ValueError as e:
        raise bad(e)


def _limit_leaks(location_limit, filter_fn=None, current_thread_only=False):
    return location_limit, filter_fn, current_thread_only


def _marker_spec(item, m):
    """pytest-memray's signature: limit_leaks(location_limit, *, filter_fn=None,
    current_thread_only=False); a wrong call is a usage error at collection."""
    def bad(why):
        return pytest.UsageError("%s: @pytest.mark.%s: %s" % (item.nodeid, MARKER, why))
    if len(m.args) > 1:
        raise bad("takes one positional argument, location_limit")
    try:
        limit, filter_fn, thread_only = _limit_leaks(*m.args, **m.kwargs)
    except TypeError as e:
        raise bad(str(e).replace("_limit_leaks()", "limit_leaks()"))
    if filter_fn is not None and not callable(filter_fn):
        raise bad("filter_fn must be callable")
    try:
        return rpt.parse_size(limit), True, filter_fn, bool(thread_only)
    except ValueError as e:
        raise bad(e)


def _checker(config):
    return config.pluginmanager.get_plugin("spyreshim-checker")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "%s(location_limit, *, filter_fn=None, current_thread_only=False): fail the test "
        "if one location (stack) keeps at least location_limit of the device memory it "
        "allocated, after garbage collection (e.g. \"1 MB\"); filter_fn(stack): whether a "
        "location counts; current_thread_only: count only what the test's thread allocated. "
        "pytest-memray's marker, read by spyreshim for device memory" % MARKER)
    config.addinivalue_line(
        "markers",
        "%s(limit, *, current_thread_only=False): fail the test if its device peak (the most "
        "device memory in use during it, above what was in use at its start) reaches limit "
        "(e.g. \"24 MB\"); current_thread_only: count only what the test's thread allocated "
        "(whoever frees it); with --fail-on-increase, also fail if the peak is above that of "
        "the test's last successful run (pytest's cache). pytest-memray's marker, read by "
        "spyreshim for device memory" % MEMORY_MARKER)
    config.pluginmanager.register(_Checker(config), "spyreshim-checker")


def pytest_collection_modifyitems(session, config, items):
    c = _checker(config)
    if c is not None:
        for item in items:
            # Bad sizes fail the session now, not mid-run.
            if c.limit_for(item) is not None or c.memory_limit_for(item) is not None:
                c.asked = True


def pytest_collection_finish(session):
    # Said even under -q (the header is not): a check that silently does
    # nothing would pass every leaking test. Not said where nothing asked
    # for a check: the plugin is loaded in every run of the environment.
    c = _checker(session.config)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if c is not None and c.asked and not c.available and tr is not None:
        tr.write_line("spyreshim: %s; device-memory leak checks are off "
                      "(run pytest under `spyreshim run -- ...`)" % spyreshim.unavailable_reason())


def pytest_report_header(config):
    c = _checker(config)
    if c is None or not c.available:
        return None
    what = ("every test (limit %s)" % rpt.format_size(c.default_limit) if c.all_tests
            else "tests marked %s or %s" % (MARKER, MEMORY_MARKER))
    return "spyreshim: %s; device-memory leak checks on %s" % (
        spyreshim.library_path() or "preloaded", what)


NATIVE_SHOWN = 6     # native frames kept below the Python ones in a failure
GROUPS_SHOWN = 10


def _trim(frames, test_file):
    """The frames that explain a test's leak, innermost first as in every
    report: up to the test function (what is outside it is pytest); where
    the test file is not in the stack (a fixture's file), the innermost
    native frames and every Python frame."""
    last = None
    for i, f in enumerate(frames):
        if f["kind"] == "python" and f["file"] and test_file and f["file"] == test_file:
            # The outermost consecutive Python frame in the test file: the
            # test function itself when helpers of the same file are involved.
            last = i
        elif last is not None and f["kind"] == "python":
            break
    if last is not None:
        kept = frames[:last + 1]
    else:
        native = 0
        kept = []
        for f in frames:
            if f["kind"] == "native":
                native += 1
                if native > NATIVE_SHOWN:
                    continue
            kept.append(f)
    return kept, len(frames) - len(kept)


class StackFrame(collections.namedtuple("StackFrame", "function filename lineno")):
    """One frame of a location's stack, for limit_leaks' filter_fn (the
    attributes pytest-memray's frames have; "???" and 0 where unknown)."""


class Stack(object):
    """A location's stack for filter_fn: `frames`, innermost first."""

    def __init__(self, frames):
        self.frames = tuple(StackFrame(f.get("function") or "???", f.get("file") or "???",
                                       f.get("line") or 0) for f in frames)


def _verdict(snap, spec, item):
    """The failure text of a checked test, or None. `spec` as limit_for's."""
    limit, per_location, filter_fn, _ = spec   # current_thread_only: in the snapshot
    test_file = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
    try:
        merged = rpt.merge([snap.report()])
    except Exception as e:   # the stacks are a bonus; the sizes are the verdict
        if (snap.bytes < limit) if per_location else (snap.bytes <= limit):
            return None
        return _head(item, snap.bytes, snap.count, limit, per_location) + \
            "\n(stacks unavailable: %s)\n" % e
    groups = [g for g in merged["groups"] if not g["suppressed"]]
    if filter_fn is not None:
        groups = [g for g in groups if filter_fn(Stack(g["frames"]))]
    if per_location:
        groups = [g for g in groups if g["bytes"] >= limit]
        if not groups:
            return None
    elif sum(g["bytes"] for g in groups) <= limit:
        return None
    head = _head(item, sum(g["bytes"] for g in groups), sum(g["count"] for g in groups), limit,
                 per_location)
    return _groups_text(head, groups, test_file)


def _head(item, nbytes, count, limit, per_location=False):
    return "spyreshim: %s left %s of device memory in %d allocation%s after " \
           "garbage collection (%s %s)" % (
               item.nodeid, rpt.format_size(nbytes), count, "" if count == 1 else "s",
               "limit per location" if per_location else "limit", rpt.format_size(limit))


def _groups_text(head, groups, test_file):
    lines = [head]
    for g in groups[:GROUPS_SHOWN]:
        frames, hidden = _trim(g["frames"], test_file)
        lines.append("")
        lines.append(rpt.group_text(dict(g, frames=frames), leaks=True,
                                    native_frames="interpreter"))
        if hidden:
            lines.append("    ... %d outer frame%s not shown" % (hidden, "" if hidden == 1 else "s"))
    if len(groups) > GROUPS_SHOWN:
        rest = groups[GROUPS_SHOWN:]
        lines.append("")
        lines.append("... and %d more group(s): %s in %d allocation(s)" % (
            len(rest), rpt.format_size(sum(g["bytes"] for g in rest)), sum(g["count"] for g in rest)))
    if groups and not any(g["frames"] for g in groups):
        lines.append("(no stacks recorded: run with --leak-check / SPYRESHIM_LEAK_CHECK=1)")
    return "\n".join(lines) + "\n"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    c = _checker(item.config)
    spec = c.limit_for(item) if c is not None and c.available else None
    memory = c.memory_limit_for(item) if c is not None and c.available else None
    if spec is None and memory is None:
        yield
        return
    if spec is not None:
        spyreshim.collect(c.gc_rounds)
        if spec[3]:
            # current_thread_only: the blocks this thread allocates are
            # told apart from now on.
            spyreshim.thread_reset_peak()
        mark = spyreshim.mark()
    if memory is not None:
        memory, thread_only = memory
        if thread_only:
            # The bytes this thread allocated, whoever frees them; what
            # other threads allocate meanwhile is not counted.
            in_use = spyreshim.thread_reset_peak()
        else:
            in_use = spyreshim.stats()["used_bytes"]
            spyreshim.reset_peak()
    outcome = yield
    if outcome.excinfo is not None:
        return
    texts = []
    if memory is not None:
        # pytest-memray's limit_memory: the test fails at its limit or above.
        # Its device peak: the most in use during it, above what was in use
        # at its start (of its own thread's, with current_thread_only).
        now = spyreshim.thread_peak() if thread_only else spyreshim.stats()["peak_used_bytes"]
        peak = max(0, now - in_use)
        text = _increase(item, peak)
        if text:
            texts.append(text)
        elif peak >= memory:
            texts.append("spyreshim: %s used a device peak of %s above the %s in use "
                         "at its start%s (limit %s)\n" % (
                             item.nodeid, rpt.format_size(peak), rpt.format_size(in_use),
                             " by its thread" if thread_only else "", rpt.format_size(memory)))
    if spec is not None:
        spyreshim.collect(c.gc_rounds)
        snap = spyreshim.snapshot(since=mark, current_thread_only=spec[3])
        try:
            if snap.bytes:
                text = _verdict(snap, spec, item)
                if text:
                    texts.append(text)
        finally:
            snap.close()
    if texts:
        c.results[item.nodeid] = "\n".join(texts)


def _increase(item, peak):
    """pytest-memray's --fail-on-increase, for the device peak: the failure
    text when the test's peak is above that of its last successful run,
    else None, the peak then kept in pytest's cache as the one to beat
    (also without the option, as pytest-memray keeps its own; a run that
    fails on the increase keeps the old one). No cache
    (-p no:cacheprovider): nothing to compare with."""
    cache = getattr(item.config, "cache", None)
    if cache is None:
        return None
    key = CACHE_KEY + item.nodeid
    entry = cache.get(key, None)
    previous = entry.get("device_peak") if isinstance(entry, dict) else None
    if _checker(item.config).fail_on_increase and isinstance(previous, int) and peak > previous:
        return ("spyreshim: %s used a device peak of %s, more than the %s "
                "of its last successful run (--fail-on-increase)\n" % (
                    item.nodeid, rpt.format_size(peak), rpt.format_size(previous)))
    cache.set(key, {"device_peak": peak})
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when != "call":
        return
    c = _checker(item.config)
    text = c.results.pop(item.nodeid, None) if c is not None else None
    if text is None:
        return
    rep = outcome.get_result()
    if rep.passed:
        rep.outcome = "failed"
        rep.longrepr = text
