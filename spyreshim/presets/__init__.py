"""Framework presets: what `spyreshim run --preset NAME` sets in the child's
environment, and the hooks the child installs at start (docs/frameworks.md).

Each preset is a module of this package with the same two functions:

    environment(env)  -> list of "NAME=value" notes: edits the mapping `env`
                         (the child's environment) before the program starts
    install()         -> (installed: bool, reason: str): registers the
                         framework's own out-of-memory hook in this process

`environment` never imports the framework (the parent stays light); it
reads what it needs from the installed files. `install` is safe to call
more than once and never raises for a framework that is absent or lacks
the hook: it says why in the reason.
"""
import importlib
import os
import sys

NAMES = ("torch", "cupy", "numba", "jax", "rmm")

# The variable the child's sitecustomize (_preset_site/) reads to install
# the hooks of these presets once their framework is imported. Read by the
# Python package only, never by the shim.
ENV_VAR = "SPYRESHIM_PRESETS"
SITE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_preset_site")


def module(name):
    if name not in NAMES:
        raise ValueError("unknown preset %r (one of: %s)" % (name, ", ".join(NAMES)))
    return importlib.import_module("spyreshim.presets." + name)


def apply(names, env):
    """Edits `env` for every preset in `names` and arranges for the child
    to install their hooks; returns the notes of what was set."""
    notes = []
    for n in names:
        notes += module(n).environment(env)
    if names:
        env[ENV_VAR] = ",".join(names)
        pp = env.get("PYTHONPATH", "")
        parts = pp.split(os.pathsep) if pp else []
        if SITE_DIR not in parts:
            env["PYTHONPATH"] = os.pathsep.join([SITE_DIR] + parts)
    return notes


def install_when_imported(names):
    """In the child (sitecustomize): installs each preset's hook right after
    its framework's top module is first imported (or now, if it already
    is), without importing any framework itself."""
    wanted = {}
    for n in names:
        try:
            m = module(n)
        except ValueError:
            continue
        wanted[m.FRAMEWORK_MODULE] = m
    for top, m in list(wanted.items()):
        if top in sys.modules:
            m.install()
            del wanted[top]
    if wanted:
        sys.meta_path.insert(0, _AfterImport(wanted))


class _AfterImport:
    """A meta path finder that finds nothing itself: it wraps the loader of
    the watched top-level modules so that the preset's install() runs
    right after the module body executed."""

    def __init__(self, wanted):
        self.wanted = wanted

    def find_spec(self, fullname, path=None, target=None):
        m = self.wanted.get(fullname)
        if m is None:
            return None
        del self.wanted[fullname]
        import importlib.util
        spec = importlib.util.find_spec(fullname)   # the real finders (we are removed)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(mod):
            orig(mod)
            try:
                m.install()
            except Exception as e:  # a hook must never break the import
                sys.stderr.write("spyreshim: preset %s: %s\n" % (m.__name__, e))
        loader.exec_module = exec_module
        return spec
