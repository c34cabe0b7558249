"""The rooms of the product code and the one direction of their dependencies.

Each room is a folder with a meson.build that declares a static library and
the rooms it depends on (`dependencies: room_deps + [x_dep, ...]`). The build
gives a room only its own include path and those of its dependencies, so an
upward #include does not compile; this test states the same rule in a form
that cannot be bypassed with a relative path, and checks that the room graph
has no cycle and that docs/architecture.md describes every room.
"""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOM_DIRS = ["shim/base", "shim/alloc", "hooks", "python_gc/interp", "python_gc/gc",
             "python_gc/stacks", "shim/leak", "shim/trace", "shim/process"]


def rooms():
    """name -> (folder, [names of rooms it depends on])"""
    out = {}
    for d in ROOM_DIRS:
        text = (REPO / d / "meson.build").read_text()
        name = re.search(r"room_(\w+) = static_library", text).group(1)
        deps = re.search(r"dependencies: room_deps \+ \[([^\]]*)\]", text).group(1)
        out[name] = (d, re.findall(r"(\w+)_dep", deps))
    return out


def closure(graph, name):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        for m in graph[n][1]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def test_every_source_folder_is_a_room():
    found = {str(p.parent.relative_to(REPO)) for p in
             list(REPO.glob("shim/**/*.c")) + list(REPO.glob("hooks/*.c")) +
             list(REPO.glob("python_gc/**/*.c"))}
    assert found == set(ROOM_DIRS)


def test_room_graph_has_no_cycle():
    graph = rooms()
    for name in graph:
        assert name not in closure(graph, name), f"room {name} depends on itself"


def test_includes_only_go_down():
    graph = rooms()
    public = {p.name for p in (REPO / "shim/include").glob("*.h")}
    headers = {name: {p.name for p in (REPO / d).glob("*.h")} for name, (d, _) in graph.items()}
    bad = []
    for name, (d, _) in graph.items():
        allowed = set(headers[name]) | public
        for dep in closure(graph, name):
            allowed |= headers[dep]
        for src in sorted((REPO / d).glob("*.[ch]")):
            for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', src.read_text(), re.M):
                inc = m.group(1)
                if "/" in inc or inc not in allowed:
                    bad.append(f"{src.relative_to(REPO)} includes {inc}")
    assert not bad, "\n".join(bad)


def test_allocator_core_knows_nothing_above_it():
    graph = rooms()
    assert closure(graph, "alloc") == {"base"}
    assert closure(graph, "base") == set()


def test_architecture_doc_names_every_room_and_file():
    doc = (REPO / "docs/architecture.md").read_text()
    graph = rooms()
    for name, (d, _) in graph.items():
        assert f"`{d}/`" in doc, f"docs/architecture.md does not describe {d}/"
        for src in (REPO / d).glob("*.c"):
            assert f"`{src.name}`" in doc, f"docs/architecture.md does not name {d}/{src.name}"
