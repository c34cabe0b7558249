"""Installed by `spyreshim run --preset ...` (spyreshim/presets/__init__.py): installs
the presets' hooks when their frameworks are imported, then runs the
sitecustomize this one shadows, if any."""
import os
import sys


def _spyreshim_presets():
    names = [n for n in os.environ.get("SPYRESHIM_PRESETS", "").split(",") if n]
    if names:
        try:
            from spyreshim import presets
            presets.install_when_imported(names)
        except Exception as e:  # never break the program's start
            sys.stderr.write("spyreshim: presets not installed: %s\n" % e)
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    mod = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib
        try:
            importlib.import_module("sitecustomize")
        except ImportError:
            pass
    finally:
        sys.path[:] = saved
        if mod is not None and "sitecustomize" not in sys.modules:
            sys.modules["sitecustomize"] = mod


_spyreshim_presets()
