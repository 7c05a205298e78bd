"""The suite's lighter Triton interpreter (tests/interpreter.py) computes what Triton's own does: the same numpy
dtype for every Triton type, and after a launch ``triton.language`` holds its own builtins again."""

import inspect
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton's interpreter is off")


def test_the_memoized_dtype_is_tritons_for_every_type():
    import triton.language as tl
    from triton.runtime import interpreter

    mine = interpreter._get_np_dtype
    assert mine.original is not mine
    types = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
             tl.bfloat16, tl.float32, tl.float64, tl.pointer_type(tl.int32), tl.block_type(tl.int64, [4])]
    for t in types * 2:  # the second round from the memo
        assert mine(t) == mine.original(t), t


def test_a_launch_leaves_tritons_builtins_as_they_were():
    import triton.language as tl

    from attnmeta.compiler.lowering.fusion import load_source

    before = {n: m for n, m in inspect.getmembers(tl) if tl.core.is_builtin(m)}
    fn = load_source("interp_probe", "import triton\nimport triton.language as tl\n\n\ndef interp_probe(x, y, n, "
                     "B: tl.constexpr):\n    o = tl.arange(0, B)\n    tl.store(y + o, tl.load(x + o, mask=o < n) * 2, "
                     "mask=o < n)\n")
    x, y = torch.arange(5, dtype=torch.int32), torch.zeros(5, dtype=torch.int32)
    fn[(1,)](x, y, 5, B=8)
    assert torch.equal(y, x * 2)
    assert {n: m for n, m in inspect.getmembers(tl) if tl.core.is_builtin(m)} == before
