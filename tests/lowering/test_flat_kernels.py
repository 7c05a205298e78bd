"""Elementwise groups over a flat extent (a window's KV slots: thousands of rows) are written with BLOCK rows per
program, masked past the row count; checked in Triton's interpreter against torch on row counts around the block
(one program, an exact number of programs, a tail), and a group with a per-row reduction stays one program per row."""

import pytest
import torch

from attnmeta.compiler.ir import DType, SpecBuilder
from attnmeta.compiler.lowering import groups
from attnmeta.compiler.lowering.fusion import generate, is_flat

I32 = DType.int32


def _graph(n: int):
    b = SpecBuilder("flat")
    x, y = b.pool("x", I32, [n]), b.pool("y", I32, [n])
    k = b.pool("k", I32, [])  # a device scalar: every program reads the same
    t = b.pool("t", I32, [37])  # a 1-D table: an index outside it reads entry 0
    with b.in_graph():
        s = b.ewise("add", x, k, name="s")
        c = b.compare("lt", s, y, name="c")
        w = b.where(c, s, b.ewise("mul", b.lookup(t, y, name="ty"), 3, name="y3"), name="w")
        total = b.reduce("sum", x, name="total")
    b.outputs(w=w, total=total)
    return b.build()


@pytest.mark.parametrize("n", [1, 5, groups.FLAT_BLOCK, 2 * groups.FLAT_BLOCK, 3 * groups.FLAT_BLOCK + 17])
def test_a_flat_group_computes_every_row_and_writes_no_row_past_the_end(n):
    from attnmeta.compiler.lowering.triton_kernels import INTERPRET

    if not INTERPRET:  # the suite's conftest turns it on: here the kernel itself is what is checked
        pytest.skip("Triton's interpreter is off in this process")
    g = _graph(n)
    group = ["s", "c", "ty", "y3", "w"]
    assert is_flat(g, group) and not is_flat(g, [*group, "total"])
    fk, run = groups.fused_target(g, group, ["w"])
    assert fk.flat and "tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)" in fk.source
    gen = torch.Generator().manual_seed(n)
    x, y = (torch.randint(-50, 50, (n,), generator=gen, dtype=torch.int32) for _ in range(2))
    k = torch.tensor(7, dtype=torch.int32)
    out = torch.full((n + 64,), -12345, dtype=torch.int32)  # the rows past n are another value's: untouched
    t = torch.arange(100, 137, dtype=torch.int32)
    args = {"x": x, "y": y, "k": k, "t": t}
    run(*[args[a] for a in fk.args], out[:n])
    s = x + 7
    ty = torch.where((y >= 0) & (y < 37), t[y.clamp(0, 36).long()], t[0])
    assert torch.equal(out[:n], torch.where(s < y, s, ty * 3))
    assert (out[n:] == -12345).all()


def test_a_group_with_a_reduction_is_one_program_per_row():
    g = _graph(40)
    fk = generate(g, ["s", "total"], ["s", "total"])
    assert not fk.flat and "i = tl.program_id(0)\n" in fk.source
