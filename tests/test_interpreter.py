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


def test_a_tuples_type_read_later_is_the_one_triton_builds_at_once():
    import triton.language as tl

    tup = tl.core.tuple
    assert tup.__init__.original is not tup.__init__
    cases = [[tl.constexpr(4), tl.constexpr(1)], [3, 5], [tl.constexpr(16)], [], [tl.int32, 2]]
    for values in cases:
        mine, theirs = tup(values), tup.__new__(tup)
        tup.__init__.original(theirs, values)
        assert str(mine.type) == str(theirs.type) and mine.type == theirs.type, values
    given = tl.core.tuple_type([tl.int32, tl.int64])
    assert tup([1, 2], given).type is given
    t = tup([tl.constexpr(2), tl.constexpr(3)])
    t._setitem(0, tl.constexpr(7))  # Triton's one mutator: it reads the type and sets the values' new one
    assert [v.value for v in t.values] == [7, 3] and str(t.type) == str(tup([tl.constexpr(7), tl.constexpr(3)]).type)


def test_a_block_type_is_tritons_and_a_bad_shape_is_refused_every_time():
    import triton.language as tl

    bt = tl.block_type
    assert bt.__init__.original is not bt.__init__
    for elt, shape in [(tl.int64, [4]), (tl.int32, [16, 1]), (tl.float32, [2, 8]), (tl.int1, tl.core.tuple([32])),
                       (tl.int64, [tl.constexpr(64), 2])]:
        mine, theirs = bt(elt, shape), bt.__new__(bt)
        bt.__init__.original(theirs, elt, shape)
        assert type(mine.shape) is type(theirs.shape) and list(mine.shape) == list(theirs.shape), shape
        assert (mine.numel, mine.name, str(mine), mine.mangle()) == (theirs.numel, theirs.name, str(theirs),
                                                                     theirs.mangle())
        assert mine == theirs and theirs == mine
    for shape, error in [([3], ValueError), ([4, 6], ValueError), ([], TypeError), ([2 ** 21], ValueError),
                         ((2, 8), AssertionError)]:  # Triton takes a list or its own tuple, not Python's
        for _ in range(2):  # refused again, not remembered as good
            with pytest.raises(error):
                bt(tl.int32, shape)
