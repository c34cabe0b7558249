"""The real CUDA toolkit, where one is installed (nothing runs on it here:
no GPU, no driver): the programs of tests/gpu/ compile and link, with the
static runtime and with -cudart shared, so the GPU check cannot rot between
the sessions that have a GPU; and the shim's own CUDA declarations
(hooks/cuda.h: types, error and attribute numbers, struct sizes, every
prototype it defines or calls) compile against the toolkit's cuda.h."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import pythons

REPO = Path(__file__).resolve().parent.parent.parent


def find_nvcc():
    for cand in [os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"]:
        if cand and os.access(cand, os.X_OK):
            return Path(cand)
    return None


@pytest.fixture(scope="module")
def toolkit():
    nvcc = find_nvcc()
    if nvcc is None:
        pythons.need("cuda-toolkit", "no CUDA toolkit installed (no nvcc on PATH or in /usr/local/cuda)")
    include = nvcc.resolve().parent.parent / "include"
    if not (include / "cuda.h").exists():
        pythons.need("cuda-toolkit", f"the toolkit of {nvcc} has no include/cuda.h")
    return nvcc, include


def run(argv, **kw):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=pythons.HANG_S,
                          **kw)


def test_the_shims_cuda_declarations_are_the_toolkits(toolkit):
    nvcc, include = toolkit
    r = run(["cc", "-std=gnu11", "-Wall", "-Werror", "-fsyntax-only", f"-I{include}",
             "-iquote", REPO / "hooks", REPO / "tests" / "programs" / "cuda_header_check.c"])
    assert r.returncode == 0, r.stderr


def needed(path):
    r = run(["readelf", "-d", path])
    assert r.returncode == 0, r.stderr
    return [l.split("[", 1)[1].rstrip("]") for l in r.stdout.splitlines() if "(NEEDED)" in l]


@pytest.mark.parametrize("cudart", ["static", "shared"])
def test_the_gpu_check_compiles_and_links(toolkit, tmp_path, cudart):
    nvcc, include = toolkit
    out = tmp_path / f"alloc_check_{cudart}"
    argv = [nvcc, "-O2", "-o", out, REPO / "tests" / "gpu" / "alloc_check.cu"]
    if cudart == "shared":
        argv[1:1] = ["-cudart", "shared"]
    r = run(argv)
    assert r.returncode == 0, r.stdout + r.stderr
    libs = needed(out)
    shared_rt = [l for l in libs if l.startswith("libcudart.so")]
    # What tests/gpu/run.sh relies on: the static build carries the runtime,
    # the shared one loads libcudart (whose cudaMalloc the shim can see).
    assert bool(shared_rt) == (cudart == "shared"), libs
