"""Elementwise groups over a flat extent (a window's KV slots: thousands of rows) are written with BLOCK rows per
program, masked past the row count; checked in Triton's interpreter against torch on row counts around the block
(one program, an exact number of programs, a tail), with rows that are scalars and rows that are short vectors
(DSV4's compressed positions: a row's value against a column every program reads), and a group with a per-row
reduction stays one program per row."""

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


def _vector_graph(n: int, w: int):
    """Rows of width ``w``: a [n, w] flag per row, a row's scalar added to a [w] column (``outer``), a 1-D lookup."""
    b = SpecBuilder("flat2")
    x, flag = b.pool("x", I32, [n]), b.pool("flag", DType.bool, [n, w])
    col, t = b.pool("col", I32, [w]), b.pool("t", I32, [37])
    with b.in_graph():
        tx = b.lookup(t, x, name="tx")
        near = b.outer("add", tx, col, name="near")
        far = b.outer("sub", b.ewise("mul", x, 2, name="x2"), col, name="far")
        out = b.where(flag, near, far, name="out")
    b.outputs(out=out)
    return b.build()


# row counts around the block at widths 2, 3, 5; a row of 300 (512 column lanes) takes two rows per program
SHAPES = [(n, w) for w in (2, 3, 5) for n in (1, 7, groups.FLAT_BLOCK // 2 + 3, 2 * groups.FLAT_BLOCK + 5)]


@pytest.mark.parametrize(("n", "w"), [*SHAPES, (1, 300), (7, 300)])
def test_rows_of_a_few_columns_are_flat_too_and_write_no_row_past_the_end(n, w):
    from attnmeta.compiler.lowering.triton_kernels import INTERPRET

    if not INTERPRET:
        pytest.skip("Triton's interpreter is off in this process")
    g = _vector_graph(n, w)
    group = ["tx", "near", "x2", "far", "out"]
    assert is_flat(g, group)
    fk, run = groups.fused_target(g, group, ["out"])
    assert fk.flat and "[:, None]" in fk.source
    gen = torch.Generator().manual_seed(n * w)
    x = torch.randint(-5, 45, (n,), generator=gen, dtype=torch.int32)
    flag = torch.rand(n, w, generator=gen) < 0.5
    col = torch.randint(-9, 9, (w,), generator=gen, dtype=torch.int32)
    t = torch.arange(100, 137, dtype=torch.int32)
    out = torch.full(((n + 3) * w,), -12345, dtype=torch.int32)  # rows past n: another value's, untouched
    args = {"x": x, "flag": flag, "col": col, "t": t}
    run(*[args[a] for a in fk.args], out[: n * w].view(n, w))
    tx = torch.where((x >= 0) & (x < 37), t[x.clamp(0, 36).long()], t[0])
    want = torch.where(flag, tx[:, None] + col[None, :], (x * 2)[:, None] - col[None, :])
    assert torch.equal(out[: n * w].view(n, w), want)
    assert (out[n * w:] == -12345).all()
