"""The package as a program run by `spyreshim run` sees it.

`run` puts this folder (spyreshim/_child_path) on the child's PYTHONPATH so
that `import spyreshim`, the presets' sitecustomize and
`-p spyreshim.pytest_plugin` work in a program of any interpreter, also
one that is not the interpreter this package was installed for. The
package's own folder cannot go there: in a wheel it is site-packages,
whose every other package would then shadow the child's own; in the source
tree it is the repository's root. This module loads the real package (two
folders up) in its place: sys.modules then holds the real one, with its
own __file__, __path__ and __spec__, and the import statement returns it.
"""
import importlib.util
import os
import sys

_real = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location(
    "spyreshim", os.path.join(_real, "__init__.py"), submodule_search_locations=[_real])
_mod = importlib.util.module_from_spec(_spec)
sys.modules["spyreshim"] = _mod
_spec.loader.exec_module(_mod)
