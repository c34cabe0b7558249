"""pytest plugin: fail tests that leave device memory behind.

    spyreshim run --leak-check -- python3 -m pytest -p spyreshim.pytest_plugin --spyreshim-leaks

    @pytest.mark.limit_leaks("1MB")
    def test_cache_may_grow_a_little(): ...

Around the call of each checked test (every test with --spyreshim-leaks,
else those marked limit_leaks): garbage is collected and a mark taken
before; after it, garbage is collected again (a few rounds, so cycles that
hold tensors are broken) and the allocations made since the mark that are
still live are summed. Above the limit (0 with --spyreshim-leaks alone, the
marker's argument otherwise) the test fails with their stacks, grouped
largest first. A test that failed by itself is not checked: its traceback
keeps its frames, and so its tensors, alive.

The wheel registers the plugin by entry point, so it is loaded in every
pytest run of that environment: unless asked (--spyreshim-leaks, or a
collected test marked limit_leaks) it checks nothing and says nothing.
Asked without libspyreshim preloaded, it says so once, after collection,
and checks nothing. A marker whose limit does not parse is a usage
error at collection. Setup and teardown are outside the window, as in
pytest-memray's limit_leaks: fixtures may cache device memory.
"""

import pytest

import spyreshim
from spyreshim import report as rpt

MARKER = "limit_leaks"


def pytest_addoption(parser):
    group = parser.getgroup("spyreshim", "device-memory leak checks (spyreshim)")
    group.addoption("--spyreshim-leaks", action="store_true", default=False,
                    help="fail every test whose device allocations grew across it "
                         "(needs libspyreshim preloaded: spyreshim run -- ...)")
    group.addoption("--spyreshim-leak-limit", metavar="SIZE", default="0",
                    help="bytes a test may leave allocated with --spyreshim-leaks "
                         "(e.g. 1MB; default 0)")
    group.addoption("--spyreshim-gc-rounds", metavar="N", type=int, default=3,
                    help="gc.collect() rounds before measuring (default 3)")


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

    def limit_for(self, item):
        m = item.get_closest_marker(MARKER)
        if m is not None:
            arg = m.args[0] if m.args else m.kwargs.get("limit", 0)
            try:
                return rpt.parse_size(arg)
            except ValueError as e:
                raise pytest.UsageError("%s: @pytest.mark.%s: %s" % (item.nodeid, MARKER, e))
        return self.default_limit if self.all_tests else None


def _checker(config):
    return config.pluginmanager.get_plugin("spyreshim-checker")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "%s(limit): fail the test if device memory it allocated and still holds after "
        "garbage collection exceeds limit (e.g. \"1MB\"; spyreshim)" % MARKER)
    config.pluginmanager.register(_Checker(config), "spyreshim-checker")


def pytest_collection_modifyitems(session, config, items):
    c = _checker(config)
    if c is not None:
        for item in items:
            if c.limit_for(item) is not None:   # bad sizes fail the session now, not mid-run
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
            else "tests marked %s" % MARKER)
    return "spyreshim: %s; device-memory leak checks on %s" % (
        spyreshim.library_path() or "preloaded", what)


NATIVE_SHOWN = 6     # native frames kept below the Python ones in a failure
GROUPS_SHOWN = 10


def _trim(frames, test_file):
    """The frames that explain a test's leak: Python frames up to the test
    function (what is outside it is pytest), then the first native frames
    (the extension that allocated; below it is the interpreter)."""
    py = [f for f in frames if f["kind"] == "python"]
    native = [f for f in frames if f["kind"] == "native"]
    for i, f in enumerate(py):
        if f["file"] and test_file and f["file"] == test_file:
            # The outermost consecutive frame in the test file: the test
            # function itself when helpers of the same file are involved.
            j = i
            while j + 1 < len(py) and py[j + 1]["file"] == test_file:
                j += 1
            py = py[:j + 1]
            break
    kept = py + native[:NATIVE_SHOWN]
    return kept, len(frames) - len(kept)


def _leak_text(snap, limit, item):
    head = "spyreshim: %s left %d bytes (%s) of device memory in %d allocation%s after " \
           "garbage collection (limit %d bytes)" % (
               item.nodeid, snap.bytes, rpt.format_size(snap.bytes), snap.count,
               "" if snap.count == 1 else "s", limit)
    lines = [head]
    try:
        merged = rpt.merge([snap.report()])
    except Exception as e:   # the stacks are a bonus; the sizes are the verdict
        lines.append("(stacks unavailable: %s)" % e)
        return "\n".join(lines) + "\n"
    test_file = str(getattr(item, "path", None) or getattr(item, "fspath", ""))
    groups = merged["groups"]
    for g in groups[:GROUPS_SHOWN]:
        frames, hidden = _trim(g["frames"], test_file)
        lines.append("")
        lines.append(rpt.group_text(dict(g, frames=frames), leaks=True))
        if hidden:
            lines.append("    ... %d outer frame%s not shown" % (hidden, "" if hidden == 1 else "s"))
    if len(groups) > GROUPS_SHOWN:
        rest = groups[GROUPS_SHOWN:]
        lines.append("")
        lines.append("... and %d more group(s): %d byte(s) in %d allocation(s)" % (
            len(rest), sum(g["bytes"] for g in rest), sum(g["count"] for g in rest)))
    if groups and not any(g["frames"] for g in groups):
        lines.append("(no stacks recorded: run with --leak-check / SPYRESHIM_LEAK_CHECK=1)")
    return "\n".join(lines) + "\n"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    c = _checker(item.config)
    limit = c.limit_for(item) if c is not None and c.available else None
    if limit is None:
        yield
        return
    spyreshim.collect(c.gc_rounds)
    mark = spyreshim.mark()
    outcome = yield
    if outcome.excinfo is not None:
        return
    spyreshim.collect(c.gc_rounds)
    snap = spyreshim.snapshot(since=mark)
    try:
        if snap.bytes > limit:
            c.results[item.nodeid] = _leak_text(snap, limit, item)
    finally:
        snap.close()


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
