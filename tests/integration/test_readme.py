"""The README is the front door (issue 48): under 250 lines, the sections
the issue names, a configuration table that is the library's own table
(shim/base/options.c) row for row, with its defaults and bounds, `run`
options that `spyreshim run` has, LD_PRELOAD paths that are absolute, and
links into docs/ that resolve. Everything else lives in docs/."""
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from spyreshim.cli import main as cli  # noqa: E402

README = (REPO / "README.md").read_text()
MAX_LINES = 250


def sections():
    """'## Title' -> its text, in order."""
    parts = re.split(r"^## (.+)$", README, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def options_rows():
    """name -> (kind, default, min, max) from options.c's table."""
    text = (REPO / "shim/base/options.c").read_text()
    table = text[text.index("static const struct row rows[]"):]
    table = table[:table.index("};")]
    out = {}
    for m in re.finditer(r'\{"(SPYRESHIM_\w+)", (K_\w+), OFF\(\w+\), "([^"]*)", ([^,]+), ([^,]+),',
                         table):
        out[m.group(1)] = (m.group(2), m.group(3), eval(m.group(4)), eval(m.group(5)))
    return out


def table_rows():
    """variable -> {column: cell} from the README's configuration table."""
    text = sections()["Configuration"]
    lines = [l for l in text.splitlines() if l.startswith("|")]
    head = [c.strip().strip("`") for c in lines[0].strip("|").split("|")]
    assert set(l.strip("|").replace("-", "").replace("|", "").strip() for l in lines[1:2]) == {""}
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert len(cells) == len(head), line
        row = dict(zip(head, cells))
        name = re.fullmatch(r"`(\w+)`", row["variable"])
        assert name, f"a row's variable is not one `NAME`: {line}"
        assert name.group(1) not in out, f"{name.group(1)} has two rows"
        out[name.group(1)] = row
    return out


def test_the_readme_is_short():
    n = len(README.splitlines())
    assert n < MAX_LINES, f"README.md has {n} lines; the rest belongs in docs/"


def test_the_readme_has_the_front_door_sections_in_order():
    names = list(sections())
    want = ["Contents", "Install", "The two commands", "Your own program", "Configuration",
            "Where the rest is"]
    assert [n for n in names if n in want] == want, names
    # What it does: the text before the first section says it, briefly.
    intro = README[:README.index("\n## ")]
    assert "LD_PRELOAD" in intro and 5 <= len(intro.splitlines()) <= 25
    # The table of contents links every section.
    for n in names[1:]:
        anchor = "#" + re.sub(r"[^a-z0-9 -]", "", n.lower()).replace(" ", "-")
        assert f"]({anchor})" in sections()["Contents"], f"Contents lacks {n}"


def test_install_and_the_two_commands():
    s = sections()
    assert "pip install ." in s["Install"]
    assert "scripts/demo.sh" in s["The two commands"]
    assert "scripts/test.sh" in s["The two commands"]
    # .ci/run runs the README's test command.
    ci = (REPO / ".ci/run").read_text()
    assert "scripts/test.sh" in ci


def test_your_own_program_names_each_kind_of_program():
    text = sections()["Your own program"]
    for what in ("PyTorch", "PyOpenCL", "CUDA", "A C program"):
        assert f"**{what}" in text, f"'Your own program' has no paragraph on {what}"
    assert "spyreshim run" in text


def test_every_ld_preload_path_is_absolute():
    for m in re.finditer(r"LD_PRELOAD=(\S+)", README):
        value = m.group(1).strip("`")
        assert value.startswith(("$PWD/", "/")), f"LD_PRELOAD={value} is relative"


def test_the_configuration_table_is_the_options_table():
    rows, table = options_rows(), table_rows()
    assert len(rows) >= 20, "options.c's table was not parsed"
    assert sorted(set(rows) - set(table)) == [], "options.c rows missing from the README's table"
    assert sorted(set(table) - set(rows)) == [], "README rows that options.c does not read"


def test_each_rows_default_and_bounds_are_the_codes():
    rows, table = options_rows(), table_rows()
    for name, (kind, default, lo, hi) in rows.items():
        row = table[name]
        assert row["default"] == (f"`{default}`" if default else "unset"), name
        if kind in ("K_UINT", "K_INT"):
            assert row["values"] == f"{lo}-{hi}", (name, row["values"])
        elif kind == "K_BOOL":
            assert row["values"] == "`0`, `1`", (name, row["values"])
        elif kind == "K_SIZE" and lo:
            assert f"`{lo >> 20}M`" in row["values"], (name, row["values"])


# A value for each `run` option that takes one.
SAMPLE = {"--log": "info", "--limit": "2G", "--stats": "s.json", "--report": "r.json",
          "--trace": "t.trace", "--exitcode": "7", "--stack-depth": "5"}


def test_each_run_option_in_the_table_sets_its_variable(monkeypatch, tmp_path):
    """The `spyreshim run` column: `run` has the option and it sets that
    row's variable in the program's environment (the exec is caught)."""
    lib = tmp_path / "libspyreshim.so"
    lib.write_bytes(b"")
    supp = tmp_path / "supp.txt"
    supp.write_text("leak:nothing\n")
    monkeypatch.setenv("SPYRESHIM_LIB", str(lib))
    monkeypatch.chdir(tmp_path)
    seen = 0
    for name, row in table_rows().items():
        for flag in re.findall(r"(--[a-z-]+)", row["spyreshim run"]):
            if flag == "--preset":
                continue  # docs/frameworks.md: what a preset sets depends on the framework
            for k in table_rows():
                monkeypatch.delenv(k, raising=False)
            got = {}

            def execvpe(file, argv, env, got=got):
                got.update(env)
                raise SystemExit(0)
            monkeypatch.setattr(cli.os, "execvpe", execvpe)
            value = str(supp) if flag == "--suppressions" else SAMPLE.get(flag)
            argv = ["run", flag] + ([value] if value else []) + ["--", "true"]
            try:
                rc = cli.main(argv)
            except SystemExit as e:
                rc = e.code
            assert rc == 0 and got, f"spyreshim {' '.join(argv)} failed"
            assert name in got, f"{' '.join(argv)} does not set {name}"
            seen += 1
    assert seen >= 10


def test_every_docs_link_resolves():
    links = set(re.findall(r"\]\(((?:docs/)[^)#]+)", README))
    links |= set(re.findall(r"(?<![\w/.])(docs/[\w./-]+\.(?:md|png))", README))
    assert len(links) >= 10
    missing = sorted(l for l in links if not (REPO / l).is_file())
    assert not missing, f"README links to docs that do not exist: {missing}"


def test_every_doc_is_listed_under_where_the_rest_is():
    text = sections()["Where the rest is"]
    for doc in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in text, f"'Where the rest is' does not list docs/{doc.name}"


def test_docs_name_no_readme_section_that_is_gone():
    # Old pointers such as 'README, "Performance"' would dangle now.
    heads = set(sections())
    for doc in sorted((REPO / "docs").glob("*.md")):
        for m in re.finditer(r'README, "([^"]+)"', doc.read_text()):
            assert m.group(1) in heads, f"{doc.name} points to README, \"{m.group(1)}\""
