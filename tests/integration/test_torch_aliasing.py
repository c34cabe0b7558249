"""In-place operators whose arguments share memory, on the simdev PyTorch
device (tests/torch/simdev_torch) and on the CPU: each row of CASES runs on
a fresh x = arange(1, 10) on both, and what it leaves in x (or the type of
the exception it raises) is the same on both, on 1.13 and 2.x
(torchrun.VERSIONS).

The device runs the CPU's kernels on host copies: these rows fail where the
copies of two aliasing arguments are made separately (the device then adds
twice to two copies, or computes where the CPU refuses the overlap)."""
import json
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchrun  # noqa: E402


@pytest.fixture(scope="module", autouse=True, params=torchrun.VERSIONS)
def torch_here(request, builddir):
    return torchrun.require(request.param)


# name: statements on x (a 9-element float tensor, 1..9), m = x.view(3, 3),
# idx(i, ...) (an index tensor) and eye (a 3x3 boolean mask), all on the
# device the row runs on
CASES = {
    # a list holding one tensor twice, or overlapping views of one
    "foreach_add_ [x, x]": "torch._foreach_add_([x, x], 1)",
    "foreach_add_ [x[:6], x[3:]]": "torch._foreach_add_([x[:6], x[3:]], 1)",
    "foreach_mul_ [x, x[2:5]]": "torch._foreach_mul_([x, x[2:5]], 2)",
    "foreach_add_ [x] [x]": "torch._foreach_add_([x], [x])",
    "foreach_addcmul_ [x[1:]] [x[:-1]]": "torch._foreach_addcmul_([x[1:]], [x[:-1]], [x[1:]])",
    # copies within one storage
    "x[1:].copy_(x[:-1])": "x[1:].copy_(x[:-1])",
    "x[:4].copy_(x[5:])": "x[:4].copy_(x[5:])",
    "m.copy_(m.t())": "m.copy_(m.t())",
    "m[0].copy_(m[:, 0])": "m[0].copy_(m[:, 0])",
    "x[::2].copy_(x[:5])": "x[::2].copy_(x[:5])",
    # elementwise operators reading what they write
    "x.add_(x)": "x.add_(x)",
    "x[1:].add_(x[:-1])": "x[1:].add_(x[:-1])",
    "x[::2].mul_(x[1::2][0])": "x[::2].mul_(x[1::2][0])",
    "m.t().mul_(m)": "m.t().mul_(m)",
    "x.addcmul_(x, x)": "x.addcmul_(x, x)",
    "add out=x[2:6] of x[:4]": "torch.add(x[:4], 1, out=x[2:6])",
    "mul out=x of x": "torch.mul(x, 2, out=x)",
    "cumsum out=x of x": "torch.cumsum(x, 0, out=x)",
    # operators with their own overlap checks
    "index_select out=x[:3] of x": "torch.index_select(x, 0, idx(4, 5, 6), out=x[:3])",
    "index_put_ from x[1:3]": "x.index_put_((idx(0, 1),), x[1:3])",
    "cat out=x[3:9] of x[:3], x[3:6]": "torch.cat([x[:3], x[3:6]], out=x[3:9])",
    "masked_fill_ through m.t()": "m.t().masked_fill_(eye, 0)",
    # views made by the CPU's kernels: writes through them reach x
    "x.unfold(0, 3, 3).mul_(10)": "x.unfold(0, 3, 3).mul_(10)",
    "m.diagonal().zero_()": "m.diagonal().zero_()",
    # in-place results are the argument itself
    "x.add_(1) is x": "assert x.add_(1) is x",
    "torch.add(x, 1, out=x) is x": "assert torch.add(x, 1, out=x) is x",
}

SCRIPT = textwrap.dedent("""\
    import json, sys
    import torch
    import simdev_torch
    cases = json.loads(sys.argv[1])
    rows = {}
    for name, code in cases.items():
        row = []
        for d in ("cpu", simdev_torch.device):
            x = torch.arange(1.0, 10.0).to(d)
            m = x.view(3, 3)
            idx = lambda *i: torch.tensor(i, device=d)
            eye = torch.eye(3, dtype=torch.bool, device=d)
            try:
                exec(code)
                row.append(x.cpu().tolist())
            except Exception as e:
                row.append(type(e).__name__)
        rows[name] = row
    print(json.dumps(rows))
    """)


def test_aliasing_in_place_operators_leave_what_the_cpu_leaves():
    r = torchrun.run(SCRIPT, args=[json.dumps(CASES)])
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows.keys() == CASES.keys()
    differ = {name: row for name, row in rows.items() if row[0] != row[1]}
    assert not differ, differ
    # The table is not vacuous: some rows raise on the CPU, others write.
    outcomes = [row[0] for row in rows.values()]
    assert "RuntimeError" in outcomes and any(isinstance(o, list) for o in outcomes), rows
    assert rows["foreach_add_ [x, x]"][0] == [3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
    assert rows["x[1:].copy_(x[:-1])"][0] == "RuntimeError"
