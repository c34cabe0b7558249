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


# Headers private to one room's files: the records and inline helpers a
# group of files shares, which no other room may see (their comments say
# so; a hook reaching into a device's shards would bypass its locks).
ROOM_PRIVATE_HEADERS = {"shim/alloc": ["arena_layout.h", "device_internal.h"]}


def test_private_headers_stay_in_their_room():
    bad = []
    for d, names in ROOM_PRIVATE_HEADERS.items():
        for name in names:
            assert (REPO / d / name).exists(), f"{d}/{name} is gone: update ROOM_PRIVATE_HEADERS"
        for other in ROOM_DIRS + ["tests/unit", "bench"]:
            if other == d:
                continue
            for src in sorted((REPO / other).glob("*.[ch]")):
                for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', src.read_text(), re.M):
                    if Path(m.group(1)).name in names:
                        bad.append(f"{src.relative_to(REPO)} includes {m.group(1)}")
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
# that includes another's header, or names a function or data (a variable
# at file scope) another file defines, depends on it, and no chain of such
# dependencies comes back to where it started. A "file" here is a module:
# foo.c, foo.h (and foo_*.S) together. What a file names through a static
# helper of a header it includes counts as its own: device.c <-> seq.c
# was a circle only through seq_take (device_internal.h) reading device.c's
# event hook.

# Circles known when this check was written and broken by work in flight;
# each entry names who removes it. A circle listed here that no longer
# exists fails the test, so that the exception cannot outlive its reason.
# Circles known and not yet broken (none now: hooks/cuda_driver.c <->
# hooks/dlsym.c was broken by cuda_driver.c registering its lookup).
PENDING_CIRCLES = set()

_KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "defined"}
_IDENT = re.compile(r"(?<![.\w])(?<!->)([A-Za-z_]\w*)")
_ATTR = re.compile(r"\b(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)|_Alignas\s*\([^()]*\)"
                   r"|_Atomic\s*\(([^()]*)\))")
_PARAMS = r"\([^(){}]*(?:\([^(){}]*\)[^(){}]*)*\)"
# A function's name and parameters (and, for one that returns a pointer to
# a function, that function's parameters) just before its body.
_FUNC_HEAD = re.compile(rf"\b([A-Za-z_]\w*)\s*{_PARAMS}(?:\s*\)\s*{_PARAMS})?\s*$")


def _code(text):
    """C text without comments, string and character literals."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(?:\\.|[^'\\\n])+'", "' '", text)


def _without_records(code):
    """C code with the bodies of its structs and unions blanked: a field is
    no use of the variable of the same name."""
    out, i = [], 0
    for m in re.finditer(r"\b(?:struct|union)\b[\s\w]*\{", code):
        if m.start() < i:
            continue
        out.append(code[i:m.end()])
        depth, j = 1, m.end()
        while depth and j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        i = j - 1
    return "".join(out) + code[i:]


def _file_scope(code):
    """The functions and the data a file defines at file scope:
    ({function: (static?, body)}, {variable (not extern): static?})."""
    code = _ATTR.sub(lambda m: m.group(1) or " ", re.sub(r"(?m)^\s*#(?:.*\\\n)*.*", " ", code))
    funcs, data, start, i = {}, {}, 0, 0
    while i < len(code):
        if code[i] == "{":
            depth, j = 0, i
            while True:
                depth += {"{": 1, "}": -1}.get(code[j], 0)
                j += 1
                if depth == 0 or j == len(code):
                    break
            head = code[start:i]
            f = _FUNC_HEAD.search(head)
            if f and "=" not in head and f.group(1) not in _KEYWORDS:
                funcs[f.group(1)] = (re.search(r"\bstatic\b", head) is not None, code[i + 1:j - 1])
                start = j
            i = j  # else a struct's or an initializer's braces: part of a declaration
            continue
        if code[i] == ";":
            decl = code[start:i]
            start = i + 1
            tag = re.match(r"\s*(?:struct|union|enum)\b[^{=]*\{.*\}\s*$", decl, re.S)
            if not tag and not re.search(r"\b(?:extern|typedef)\b", decl):
                static = re.search(r"\bstatic\b", decl) is not None
                decl = re.sub(r"\{.*\}|\[[^\]]*\]", " ", decl, flags=re.S)
                for part in re.split(r",(?![^()]*\))", decl):
                    part = part.split("=")[0]
                    ptr = re.search(r"\(\s*\*[\s\w]*?\b(\w+)\s*\)\s*\(", part)
                    names = re.findall(r"[A-Za-z_]\w*", part)
                    if ptr:
                        data[ptr.group(1)] = static  # a pointer to a function
                    elif names and "(" not in part and names[-1] not in _KEYWORDS:
                        data[names[-1]] = static
        i += 1
    return funcs, data


def file_graph(root, dirs):
    """module ("dir/stem") -> {module it depends on: the first reason}

    A module depends on another whose header it includes, or whose
    function or data (a variable defined at file scope, not static) it
    names, in its own code or in a static function of a header it includes
    (a private header's inline helpers are their callers' code)."""
    mods = {}
    for d in dirs:
        for p in sorted((root / d).glob("*.[chS]")):
            stem = p.stem.split("_x86_64")[0] if p.suffix == ".S" else p.stem
            mods.setdefault(f"{d}/{stem}", []).append(p)
    header_of = {p.name: m for m, ps in mods.items() for p in ps if p.suffix == ".h"}
    header_path = {p.name: p for ps in mods.values() for p in ps if p.suffix == ".h"}
    code = {p: _code(p.read_text()) for ps in mods.values() for p in ps}
    defined_in, inline_in, own = {}, {}, {}
    for m, ps in mods.items():
        for p in ps:
            funcs, data = _file_scope(code[p]) if p.suffix in (".c", ".h") else ({}, {})
            for name, (static, body) in funcs.items():
                if p.suffix == ".h" and static:
                    inline_in[(p.name, name)] = body
                elif p.suffix == ".c" and not static and not name.startswith("__"):
                    defined_in.setdefault(name, m)
            if p.suffix == ".c":
                for name, static in data.items():
                    if not static:
                        defined_in.setdefault(name, m)
                own[p] = set(funcs) | set(data)
    includes = {p: [Path(inc).name for inc in
                    re.findall(r'^\s*#\s*include\s+"([^"]+)"', p.read_text(), re.M)]
                for ps in mods.values() for p in ps}
    # A header of no .c of its own, included by module M's .c, is M's
    # private header (a layout shared by M's files): its include of M's
    # header is M seeing itself, not a dependency back.
    private_of = {}
    for m, ps in mods.items():
        for p in ps:
            if p.suffix == ".c":
                for h in map(header_of.get, includes[p]):
                    if h and h != m and all(q.suffix == ".h" for q in mods[h]):
                        private_of.setdefault(h, set()).add(m)
    graph = {m: {} for m in mods}
    for m, ps in mods.items():
        for p in ps:
            for inc in includes[p]:
                t = header_of.get(inc)
                if t and t != m and t not in private_of.get(m, ()):
                    graph[m].setdefault(t, f"{p.name} includes {inc}")
            if p.suffix != ".c":
                continue
            # The headers it sees, and the inline helpers in them.
            seen, todo = set(), list(includes[p])
            while todo:
                h = todo.pop()
                if h in header_path and h not in seen:
                    seen.add(h)
                    todo += includes[header_path[h]]
            inline = {name: body for (h, name), body in inline_in.items() if h in seen}
            # Its own names (a static of its own hides another file's).
            refs = {name: "" for name in _IDENT.findall(_without_records(code[p]))
                    if name not in own[p]}
            todo = [n for n in refs if n in inline]
            while todo:
                n = todo.pop()
                for name in _IDENT.findall(inline.pop(n, "")):
                    if name not in refs:
                        refs[name] = f" (in {n})"
                        todo.append(name)
            for name in sorted(refs):
                t = defined_in.get(name)
                if t and t != m:
                    graph[m].setdefault(t, f"{p.name} uses {name}{refs[name]}")
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


def test_the_circle_check_sees_data_and_inline_helpers(tmp_path):
    # The shape of issue 45: a private header (no .c of its own) declares
    # the data its module's files share and inlines helpers that read it;
    # dev.c defines the data and calls seq.c, seq.c reads dev.c's data
    # only through the header's helper. A circle.
    d = tmp_path / "room"
    d.mkdir()
    (d / "internal.h").write_text(
        "extern int hook;\nextern int counter;\n"
        "static inline int take(void)\n{\n    return hook ? counter++ : 0;\n}\n"
        "int seq_next(void);\n")
    (d / "dev.c").write_text('#include "internal.h"\nint hook;\n'
                             "int dev_new(void)\n{\n    return seq_next();\n}\n")
    (d / "seq.c").write_text('#include "internal.h"\nint counter;\n'
                             "int seq_next(void)\n{\n    return take();\n}\n")
    # Data read directly, and a pointer to a function: the same.
    (d / "shard.h").write_text("void shard_make(void);\n")
    (d / "shard.c").write_text('#include "internal.h"\n#include "shard.h"\n'
                               "void (*shard_fn)(void);\n"
                               "void shard_make(void)\n{\n    if (hook)\n        return;\n}\n")
    (d / "user.c").write_text("extern void (*shard_fn)(void);\n"
                              "void user(void)\n{\n    shard_fn();\n}\n")
    # A file's own static of the same name hides another file's, and a
    # field of that name is no use of it.
    (d / "other.c").write_text('#include "shard.h"\nstatic int hook;\nstruct s { int counter; };\n'
                               "int other(struct s *p)\n{\n    shard_make();\n"
                               "    return hook + p->counter;\n}\n")
    graph = file_graph(tmp_path, ["room"])
    assert graph["room/seq"]["room/dev"] == "seq.c uses hook (in take)"
    assert graph["room/shard"]["room/dev"] == "shard.c uses hook"
    assert graph["room/user"]["room/shard"] == "user.c uses shard_fn"
    assert set(graph["room/other"]) == {"room/shard"}, graph["room/other"]
    assert set(circles(graph)) == {frozenset({"room/dev", "room/seq"})}
    # The data moved down into a file of its own: one way.
    (d / "dev.c").write_text('#include "internal.h"\n'
                             "int dev_new(void)\n{\n    return seq_next();\n}\n")
    (d / "hooks.c").write_text('#include "internal.h"\nint hook;\n')
    graph = file_graph(tmp_path, ["room"])
    assert circles(graph) == []
    assert graph["room/seq"]["room/hooks"] == "seq.c uses hook (in take)"


# ---- the Python package's rooms ----------------------------------------------
# spyreshim/ has rooms by concept as the C side has; a module's imports of
# another room go down this order only (presets stand apart: they import
# nothing of the others), and docs/architecture.md names every module.
PY_ROOMS = ["reading", "exports", "views", "cli"]
PY_PKG = REPO / "spyreshim"


def _py_room_imports():
    """[(module path, room it imports)] for every intra-package import."""
    out = []
    for src in sorted(PY_PKG.glob("*/*.py")):
        if src.parent.name.startswith("_"):
            continue
        for m in re.finditer(r"^\s*from (\.+)(\w*)(?:\.\w+)* import ([\w, ]+)", src.read_text(), re.M):
            dots, first, names = m.groups()
            if dots == ".":
                out.append((src, src.parent.name))
            elif dots == ".." and first:
                out.append((src, first))
            elif dots == "..":   # from .. import presets: a room by name
                out += [(src, n.split(" as ")[0].strip()) for n in names.split(",")
                        if (PY_PKG / n.split(" as ")[0].strip()).is_dir()]
    return out


def test_python_rooms_import_one_way():
    bad = []
    for src, room in _py_room_imports():
        mine = src.parent.name
        if room == mine:
            continue
        if mine == "presets" or room == "presets" and mine != "cli":
            bad.append(f"{src.relative_to(REPO)} imports {room}")
        elif room in PY_ROOMS and mine in PY_ROOMS and PY_ROOMS.index(room) > PY_ROOMS.index(mine):
            bad.append(f"{src.relative_to(REPO)} ({mine}) imports {room}, a room above it")
    assert not bad, "\n".join(bad)


def test_python_package_is_rooms_and_the_doc_names_every_module():
    doc = (REPO / "docs/architecture.md").read_text()
    flat = sorted(p.name for p in PY_PKG.glob("*.py"))
    assert flat == ["__init__.py", "__main__.py", "_preloaded.py", "pytest_plugin.py"], \
        "a module at the package's top: put it in a room (docs/architecture.md)"
    missing = []
    for src in sorted(PY_PKG.glob("*/*.py")):
        room = src.parent.name
        if room.startswith("_"):
            continue
        assert f"`spyreshim/{room}/`" in doc, f"docs/architecture.md does not describe spyreshim/{room}/"
        if src.name != "__init__.py" and f"`{src.name}`" not in doc:
            missing.append(str(src.relative_to(REPO)))
    assert not missing, "docs/architecture.md does not name: " + ", ".join(missing)
