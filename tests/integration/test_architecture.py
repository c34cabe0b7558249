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


# ---- circles of files -------------------------------------------------------
# Inside a room, files may depend on each other, but one way only: a file
# that includes another's header, or calls a function another file defines,
# depends on it, and no chain of such dependencies comes back to where it
# started. A "file" here is a module: foo.c, foo.h (and foo_*.S) together.

# Circles known when this check was written and broken by work in flight;
# each entry names who removes it. A circle listed here that no longer
# exists fails the test, so that the exception cannot outlive its reason.
# Circles that are known and being broken elsewhere; none today. The
# test below fails on an entry that no longer circles, so the list cannot
# go stale.
PENDING_CIRCLES = set()

_KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "defined"}
_DEF = re.compile(r"^(?!static\b)(?!typedef\b)(?!extern\b)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*"
                  r"\([^;{}]*\)\s*(?:__attribute__\s*\(\(.*?\)\)\s*)?\{", re.M)


def _code(text):
    """C text without comments and string literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)


def file_graph(root, dirs):
    """module ("dir/stem") -> {module it depends on: the first reason}"""
    mods = {}
    for d in dirs:
        for p in sorted((root / d).glob("*.[chS]")):
            stem = p.stem.split("_x86_64")[0] if p.suffix == ".S" else p.stem
            mods.setdefault(f"{d}/{stem}", []).append(p)
    header_of = {p.name: m for m, ps in mods.items() for p in ps if p.suffix == ".h"}
    defined_in = {}
    for m, ps in mods.items():
        for p in ps:
            if p.suffix == ".c":
                for f in _DEF.finditer(_code(p.read_text())):
                    name = f.group(1)
                    if not name.startswith("__") and name not in _KEYWORDS:
                        defined_in.setdefault(name, m)
    includes = {p: [header_of.get(Path(inc).name) for inc in
                    re.findall(r'^\s*#\s*include\s+"([^"]+)"', p.read_text(), re.M)]
                for ps in mods.values() for p in ps}
    # A header of no .c of its own, included by module M's .c, is M's
    # private header (a layout shared by M's files): its include of M's
    # header is M seeing itself, not a dependency back.
    private_of = {}
    for m, ps in mods.items():
        for p in ps:
            if p.suffix == ".c":
                for h in includes[p]:
                    if h and h != m and all(q.suffix == ".h" for q in mods[h]):
                        private_of.setdefault(h, set()).add(m)
    graph = {m: {} for m in mods}
    for m, ps in mods.items():
        for p in ps:
            raw = p.read_text()
            for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', raw, re.M):
                t = header_of.get(Path(inc).name)
                if t and t != m and t not in private_of.get(m, ()):
                    graph[m].setdefault(t, f"{p.name} includes {inc}")
            if p.suffix == ".c":
                for name in sorted(set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", _code(raw)))):
                    t = defined_in.get(name)
                    if t and t != m:
                        graph[m].setdefault(t, f"{p.name} calls {name}")
    return graph


def circles(graph):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def describe(graph, comp):
    return "; ".join(f"{a} -> {b} ({graph[a][b]})" for a in sorted(comp)
                     for b in sorted(graph[a]) if b in comp)


def test_no_circle_of_files():
    graph = file_graph(REPO, ROOM_DIRS)
    found = set(circles(graph))
    new = [describe(graph, c) for c in found - PENDING_CIRCLES]
    assert not new, "circles of files:\n" + "\n".join(new)
    stale = [sorted(c) for c in PENDING_CIRCLES - found]
    assert not stale, f"no longer circles: remove them from PENDING_CIRCLES: {stale}"


def test_the_circle_check_sees_includes_and_calls(tmp_path):
    # The two shapes of issue 25: log.c <-> options.c by headers (each
    # includes the other's), cuda_driver.c <-> dlsym.c by calls (each calls
    # a function the other defines, through a header of neither).
    d = tmp_path / "room"
    d.mkdir()
    (d / "log.h").write_text("void shim_log(void);\n")
    (d / "options.h").write_text("int *shim_opts(void);\n")
    (d / "log.c").write_text('#include "log.h"\n#include "options.h"\n'
                             "void shim_log(void)\n{\n    shim_opts();\n}\n")
    (d / "options.c").write_text('#include "log.h"\n#include "options.h"\n'
                                 "int *shim_opts(void)\n{\n    return 0;\n}\n")
    (d / "shared.h").write_text("void *lookup(void);\nvoid *real_dlsym(void);\n")
    (d / "driver.c").write_text('#include "shared.h"\n'
                                "void *lookup(void)\n{\n    return real_dlsym();\n}\n")
    (d / "dlsym.c").write_text('#include "shared.h"\n/* lookup() in a comment is no call */\n'
                               "void *real_dlsym(void)\n{\n    return lookup();\n}\n")
    (d / "leaf.c").write_text('#include "options.h"\n'
                              "static int f(void)\n{\n    return *shim_opts();\n}\n")
    # A private header: arena.c includes layout.h (no .c of its own), which
    # includes arena.h for the types it completes. No circle.
    (d / "arena.h").write_text("typedef struct arena arena;\narena *arena_new(void);\n")
    (d / "layout.h").write_text('#include "arena.h"\nstruct arena { int n; };\n')
    (d / "arena.c").write_text('#include "arena.h"\n#include "layout.h"\n'
                               "arena *arena_new(void)\n{\n    return 0;\n}\n")
    found = set(circles(file_graph(tmp_path, ["room"])))
    assert found == {frozenset({"room/log", "room/options"}),
                     frozenset({"room/driver", "room/dlsym"})}, found
    # ...but a header of another .c that includes back is one.
    (d / "layout.c").write_text('#include "layout.h"\n')
    assert frozenset({"room/arena", "room/layout"}) in circles(file_graph(tmp_path, ["room"]))
    (d / "layout.c").unlink()
    # One way only is no circle.
    (d / "options.c").write_text('#include "options.h"\n'
                                 "int *shim_opts(void)\n{\n    return 0;\n}\n")
    (d / "dlsym.c").write_text('#include "shared.h"\n'
                               "void *real_dlsym(void)\n{\n    return 0;\n}\n")
    assert circles(file_graph(tmp_path, ["room"])) == []
