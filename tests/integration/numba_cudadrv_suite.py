"""Runs numba's own CUDA driver tests (the package numba.cuda.tests.cudadrv
of whichever numba the interpreter has: Debian's, or numba-cuda's) in this
process and prints one JSON line: the ids of the tests that passed, that
failed or raised (with the last line of each one's error), and that were
skipped. Used by test_cudadrv_numba.py,
with and without the shim, on the CUDA driver stand-in."""
import importlib
import json
import os
import sys
import unittest


def tid(test):
    """The test's id without the description of its parameters (which may
    name objects by address): several subtests share one id."""
    return test.id().split(" ", 1)[0]


class Result(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.passed = []

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed.append(tid(test))


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "numba.cuda.tests.cudadrv"
    loader = unittest.TestLoader()
    # numba's load_tests() names each test module by its path relative to
    # the loader's top-level folder: the one that holds the numba package.
    top = importlib.import_module(name.split(".")[0]).__path__[0]
    loader._top_level_dir = os.path.dirname(top)
    suite = loader.loadTestsFromName(name)
    result = Result()
    suite.run(result)
    bad = sorted({tid(t) for t, _ in result.failures + result.errors})
    why = {tid(t): tb.strip().splitlines()[-1][:300] for t, tb in result.failures + result.errors}
    # A test counts as passed only when none of its subtests failed.
    out = {"passed": sorted(set(result.passed) - set(bad)), "failed": bad, "why": why,
           "skipped": sorted({tid(t) for t, _ in result.skipped})}
    sys.stdout.flush()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
