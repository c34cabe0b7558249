"""The HTML report (`spyreshim report --html`): a well-formed, self-contained
page whose flame graph has the stacks and sizes of the reports, every
report string escaped; rendered by headless Chromium (screenshot, and the
click-to-zoom script checked through the DOM it leaves).

Set SPYRESHIM_SCREENSHOT_DIR to keep the screenshots for a look.
"""
import html.parser
import json
import re
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = REPO / "scripts" / "spyreshim"
DATA = HERE / "data"
sys.path.insert(0, str(REPO))

from spyreshim.views import flamegraph  # noqa: E402
from spyreshim.reading import report as rpt

sys.path.insert(0, str(HERE))
import pythons  # noqa: E402

VOID = {"meta", "br", "rect", "link", "img", "input", "hr", "path"}
HOSTILE = "</script><script>alert('x')</script><b a=\"1\">&amp;"


class Page(html.parser.HTMLParser):
    """Records the structure and fails on unbalanced tags."""

    def __init__(self):
        html.parser.HTMLParser.__init__(self, convert_charrefs=True)
        self.stack = []
        self.errors = []
        self.tags = []           # (tag, attrs dict, depth-path)
        self.text = []
        self.titles = []         # SVG tooltips
        self.boxes = []          # attrs of g.f, with their rect and text
        self._in_title = False
        self._box = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "g" and "f" in a.get("class", "").split():
            self._box = {"attrs": a, "title": "", "label": ""}
            self.boxes.append(self._box)
        if tag == "rect" and self._box is not None:
            self._box["rect"] = a
        if tag == "title" and self._box is not None:
            self._in_title = True
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "rect" and self._box is not None:
            self._box["rect"] = dict(attrs)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append("</%s> closes <%s>" % (tag, self.stack[-1] if self.stack else None))
            return
        self.stack.pop()
        if tag == "title":
            self._in_title = False
        if tag == "g":
            self._box = None

    def handle_data(self, data):
        self.text.append(data)
        if self._box is not None:
            if self._in_title:
                self._box["title"] += data
            elif self.stack and self.stack[-1] == "text":
                self._box["label"] += data


def parse(page):
    p = Page()
    p.feed(page)
    p.close()
    assert not p.errors, p.errors[:5]
    assert p.stack == [], "unclosed: %s" % p.stack
    return p


def write_page(tmp_path, *files, args=()):
    out = tmp_path / "report.html"
    r = subprocess.run([str(SCRIPT), "report", "--html", str(out)] + list(args) +
                       [str(f) for f in files], capture_output=True, text=True,
                       timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert "wrote %s" % out in r.stderr
    return out


@pytest.fixture
def hostile(tmp_path):
    """A report whose names try to break out of the page."""
    d = {"format": "spyreshim-report", "version": 1, "pid": 31, "exe": HOSTILE, "reason": "exit",
         "groups": [{"bytes": 3000, "count": 3, "runtime": "simdev<i>", "frames": [
             {"kind": "python", "function": HOSTILE, "file": "/t/<evil>&.py", "line": 5},
             {"kind": "native", "function": "operator<<(std::ostream&, T const&)",
              "object": "/b/\"q\".so", "address": "0x10", "offset": "0x10"}]}]}
    p = tmp_path / "hostile.json"
    p.write_text(json.dumps(d))
    return p


def test_page_is_well_formed_and_self_contained(tmp_path):
    out = write_page(tmp_path, DATA / "leak_single.json", DATA / "rank0_pid101.json",
                     DATA / "rank1_pid102.json")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    p = parse(page)
    names = [t for t, _ in p.tags]
    assert names.count("html") == names.count("body") == names.count("svg") == 1
    # Nothing fetched: no external scripts, styles, images or fonts.
    for tag, a in p.tags:
        assert tag not in ("link", "img", "iframe", "object", "embed"), tag
        assert "src" not in a, (tag, a)
        assert not a.get("href", "").startswith(("http:", "https:", "//")), (tag, a)
    assert "@import" not in page and "url(" not in page


def test_page_has_the_stacks_and_sizes(tmp_path):
    out = write_page(tmp_path, DATA / "leak_single.json", DATA / "rank0_pid101.json",
                     DATA / "rank1_pid102.json")
    p = parse(out.read_text(encoding="utf-8"))
    text = "".join(p.text)
    for s in ("in make_leak /t/leak.py:12 [python]",
              "0x7f3a2c001234 in Tensor_init simdevmodule.c:88",
              "in forward /job/model.py:77 [python]",
              "std::vector<float*>::push_back(float* const&)",
              "16777216", "16.0 MiB", "2097152", "2.0 MiB", "1048576",
              "pids 101, 102, 4242"):
        assert s in text, s
    # Suppressed memory is not drawn, only mentioned.
    assert "known_cache_alloc" not in text
    assert "Not shown: 4096 B (4.0 KiB) in 1 allocation matched by suppressions." in text
    # Every box has a tooltip with its exact size.
    assert p.boxes and all(re.search(r"\n\d+ B( \(|,)", b["title"]) for b in p.boxes)
    tips = {b["attrs"]["data-label"]: b["title"] for b in p.boxes}
    assert "16777216 B (16.0 MiB), 45.7% in 8 allocations; pids 101, 102" in tips["forward (model.py:77)"]
    assert tips["all live device memory"].startswith("all live device memory\n36700160 B (35.0 MiB)")


def test_flame_graph_geometry_follows_the_bytes(tmp_path):
    out = write_page(tmp_path, DATA / "leak_single.json", DATA / "rank0_pid101.json",
                     DATA / "rank1_pid102.json")
    p = parse(out.read_text(encoding="utf-8"))
    boxes = [dict(b, x0=float(b["attrs"]["data-x0"]), w=float(b["attrs"]["data-w"]),
                  d=int(b["attrs"]["data-d"])) for b in p.boxes]
    root = boxes[0]
    assert root["d"] == 0 and root["w"] == 1.0
    assert float(root["rect"]["width"]) == flamegraph.WIDTH
    total = 36700160
    for b in boxes:
        nbytes = int(b["title"].split("\n")[1].split(" B")[0])
        assert abs(b["w"] - nbytes / total) < 1e-6, b
        assert abs(float(b["rect"]["width"]) - b["w"] * flamegraph.WIDTH) < 0.02, b
        # Deeper frames are drawn higher: the root at the bottom.
        assert float(b["rect"]["y"]) == pytest.approx(float(root["rect"]["y"]) - b["d"] * flamegraph.ROW)
    # Children sit inside their parent and do not overlap (pre-order list).
    for i, b in enumerate(boxes):
        kids = []
        for c in boxes[i + 1:]:
            if c["d"] <= b["d"]:
                break
            if c["d"] == b["d"] + 1:
                kids.append(c)
        assert sum(k["w"] for k in kids) <= b["w"] + 1e-9
        for k1, k2 in zip(kids, kids[1:]):
            assert k1["x0"] + k1["w"] <= k2["x0"] + 1e-9
        for k in kids:
            assert b["x0"] - 1e-9 <= k["x0"] and k["x0"] + k["w"] <= b["x0"] + b["w"] + 1e-9


def test_python_frames_sit_above_native_frames(tmp_path):
    out = write_page(tmp_path, DATA / "leak_single.json")
    p = parse(out.read_text(encoding="utf-8"))
    depth = {b["attrs"]["data-label"]: int(b["attrs"]["data-d"]) for b in p.boxes}
    kinds = {b["attrs"]["data-label"]: b["attrs"]["class"].split()[1] for b in p.boxes}
    # Outermost (the interpreter's frames, one box by default) at the root,
    # the innermost Python frame on top.
    assert depth["[python3.11: 2 frames]"] == 1
    assert depth["Tensor_init"] == 2
    assert depth["<module> (leak.py:20)"] == 3
    assert depth["make_leak (leak.py:12)"] == 4
    assert kinds["make_leak (leak.py:12)"] == "python" and kinds["Tensor_init"] == "native"
    out = write_page(tmp_path, DATA / "leak_single.json", args=["--native-frames=all"])
    p = parse(out.read_text(encoding="utf-8"))
    depth = {b["attrs"]["data-label"]: int(b["attrs"]["data-d"]) for b in p.boxes}
    assert depth["main"] == 1 and depth["_PyEval_EvalFrameDefault"] == 2
    assert depth["make_leak (leak.py:12)"] == 5


def test_every_report_string_is_escaped(tmp_path, hostile):
    out = write_page(tmp_path, hostile)
    page = out.read_text(encoding="utf-8")
    p = parse(page)
    names = [t for t, _ in p.tags]
    assert names.count("script") == 1      # ours, no injected one
    assert "b" not in names and "i" not in names and "evil" not in names
    text = "".join(p.text)
    assert HOSTILE in text                 # shown literally
    assert "operator<<(std::ostream&, T const&)" in text
    assert "/t/<evil>&.py:5" in text
    labels = [b["attrs"]["data-label"] for b in p.boxes]
    assert "operator<<(std::ostream&, T const&)" in labels


def test_top_limits_the_table_not_the_graph(tmp_path):
    out = write_page(tmp_path, DATA / "leak_single.json", args=["--top", "1"])
    text = "".join(parse(out.read_text(encoding="utf-8")).text)
    assert "1 more stack not shown (--top 1;" in text
    assert "in make_leak /t/leak.py:12" in text
    assert "0x7f3a2d000400 in std::vector" not in text
    assert "3145728 B (3.0 MiB)" in text          # the root still counts everything


def _report(tmp_path, groups, name="r.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"format": "spyreshim-report", "version": 1, "pid": 5,
                             "reason": "exit", "groups": groups}))
    return p


def _group(nbytes, fn):
    return {"bytes": nbytes, "count": 1, "runtime": "simdev",
            "frames": [{"kind": "python", "function": fn, "file": "/t/a.py", "line": 1},
                       {"kind": "native", "function": "main", "object": "/bin/x",
                        "address": "0x1", "offset": "0x1"}]}


def test_sub_pixel_boxes_are_left_out_of_the_graph_not_the_table(tmp_path):
    # 1 byte in 10^6: far below 0.1 px of 1200.
    p = _report(tmp_path, [_group(10 ** 6, "big"), _group(1, "tiny")])
    parsed = parse(write_page(tmp_path, p).read_text(encoding="utf-8"))
    labels = [b["attrs"]["data-label"] for b in parsed.boxes]
    assert "big (a.py:1)" in labels and "tiny (a.py:1)" not in labels
    # "main" is shared: still there, with both groups' bytes.
    assert [b["title"] for b in parsed.boxes if b["attrs"]["data-label"] == "main"][0] \
        .split("\n")[1].startswith("1000001 B (976.6 KiB)")
    text = "".join(parsed.text)
    assert "1 frame narrower than 0.1 px left out of the graph" in text
    assert "in tiny /t/a.py:1 [python]" in text


def test_table_lists_the_largest_hundred_by_default(tmp_path):
    p = _report(tmp_path, [_group(1000 + i, "f%d" % i) for i in range(150)])
    parsed = parse(write_page(tmp_path, p).read_text(encoding="utf-8"))
    text = "".join(parsed.text)
    assert "50 more stacks not shown (--top 100;" in text
    assert "in f149 /t/a.py:1" in text and "in f49 /t/a.py:1" not in text
    # The graph has every one of them.
    assert len([b for b in parsed.boxes if b["attrs"]["class"] == "f python"]) == 150


def test_page_of_an_empty_report(tmp_path):
    p = tmp_path / "empty.json"
    p.write_text(json.dumps({"format": "spyreshim-report", "version": 1, "groups": []}))
    page = write_page(tmp_path, p).read_text(encoding="utf-8")
    parsed = parse(page)
    # An empty leak page says so in words, with no empty graph or table.
    assert not parsed.boxes and "0 B in 0 allocations" in "".join(parsed.text)
    assert ('<p class="empty" id="empty">No device memory leaks: nothing allocated was left '
            'live at exit.</p>') in page
    assert "<table>" not in page and "<svg" not in page
    # A snapshot's empty page says what it holds, not "no leaks".
    p.write_text(json.dumps({"format": "spyreshim-report", "version": 1, "groups": [],
                             "reason": "snapshot"}))
    page = write_page(tmp_path, p).read_text(encoding="utf-8")
    assert '<p class="empty" id="empty">Nothing was live in a snapshot.</p>' in page


def test_page_from_the_library_api():
    merged = rpt.merge([rpt.load(str(DATA / "leak_single.json"))])
    p = parse(flamegraph.page(merged, title="t<1>", show_suppressed=True))
    assert "known_cache_alloc" in [b["attrs"]["data-label"] for b in p.boxes]
    assert "t<1>" in "".join(p.text)


# ----------------------------------------------------------- headless Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium(tmp_path, *args):
    if CHROMIUM is None:
        pythons.need("chromium", "chromium is not installed (Debian: apt-get install chromium)")
    profile = tmp_path / "profile"
    profile.mkdir(exist_ok=True)
    r = subprocess.run([CHROMIUM] + FLAGS + ["--user-data-dir=%s" % profile] + list(args),
                       capture_output=True, timeout=pythons.HANG_S)
    assert r.returncode == 0, r.stderr.decode(errors="replace")[-2000:]
    return r


def png_size(path):
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24]), len(data)


def keep(path):
    d = os.environ.get("SPYRESHIM_SCREENSHOT_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        shutil.copy(path, d)


@pytest.mark.parametrize("fragment", ["", "#zoom=2"])
def test_chromium_screenshot(tmp_path, fragment):
    out = write_page(tmp_path, DATA / "leak_single.json", DATA / "rank0_pid101.json",
                     DATA / "rank1_pid102.json")
    shot = tmp_path / ("flamegraph%s.png" % ("-zoomed" if fragment else ""))
    chromium(tmp_path, "--screenshot=%s" % shot, "--window-size=1280,900",
             out.as_uri() + fragment)
    (w, h), size = png_size(shot)
    assert (w, h) == (1280, 900)
    # A blank page compresses to a few hundred bytes; this one has boxes and text.
    assert size > 10000, size
    keep(shot)


def test_chromium_runs_the_zoom_script(tmp_path):
    """#zoom=N zooms to box N as a click does: it spans the width, its
    ancestors too, unrelated boxes hide."""
    out = write_page(tmp_path, DATA / "rank0_pid101.json", DATA / "rank1_pid102.json")
    before = parse(out.read_text(encoding="utf-8")).boxes
    target = [i for i, b in enumerate(before) if b["attrs"]["data-label"] == "<module> (train.py:50)"]
    assert len(target) == 1
    i = target[0]
    r = chromium(tmp_path, "--dump-dom", "--virtual-time-budget=2000", out.as_uri() + "#zoom=%d" % i)
    after = parse(r.stdout.decode("utf-8")).boxes
    assert len(after) == len(before)
    hidden = [b["attrs"]["data-label"] for b in after if "display: none" in b["attrs"].get("style", "")]
    shown = {b["attrs"]["data-label"]: b for b in after
             if "display: none" not in b["attrs"].get("style", "")}
    assert set(shown) == {"all live device memory", "Tensor_init", "<module> (train.py:50)",
                          "all_gather_buffer (dist.py:9)"}
    assert "forward (model.py:77)" in hidden
    for b in shown.values():
        assert float(b["rect"]["width"]) == pytest.approx(flamegraph.WIDTH, abs=0.01)
        assert float(b["rect"]["x"]) == 0
