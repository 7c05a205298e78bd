"""The emulated graph has CUDA-graph semantics: replay re-runs the captured
work on the captured tensors only, and capture rejects host syncs."""

import pytest
import torch
import triton
import triton.language as tl

from attnmeta.compiler.lowering import triton_kernels
from attnmeta.runtime import CaptureSyncError, EmulatedGraph


def test_replay_recomputes_from_current_contents_in_place():
    x = torch.tensor([1, 2, 3], dtype=torch.int32)
    out = torch.zeros(4, dtype=torch.int32)
    g = EmulatedGraph()
    with g.capture():
        y = torch.cumsum(x, 0, dtype=torch.int32)
        out[1:].copy_(y * 2)
    assert out.tolist() == [0, 2, 6, 12]
    x.copy_(torch.tensor([5, 5, 5], dtype=torch.int32))
    g.replay()
    assert out.tolist() == [0, 10, 20, 30]


def test_rebound_buffer_is_not_read_at_replay():
    state = {"x": torch.tensor([1.0, 2.0])}
    out = torch.zeros(2)
    g = EmulatedGraph()
    with g.capture():
        out.copy_(state["x"] + 1)
    state["x"] = torch.tensor([10.0, 20.0])  # rebinding, as a buggy backend would at replay
    g.replay()
    assert out.tolist() == [2.0, 3.0]  # stale: the graph still reads the captured tensor


def test_python_logic_and_scalars_are_frozen_at_capture():
    x = torch.ones(3)
    out = torch.zeros(3)
    n = {"scale": 2.0}
    g = EmulatedGraph()
    with g.capture():
        out.copy_(x * n["scale"])
    n["scale"] = 5.0
    g.replay()
    assert out.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("sync", [
    lambda t: t.sum().item(), lambda t: t.tolist(), lambda t: t.cpu(), lambda t: int(t[0]),
    lambda t: torch.nonzero(t), lambda t: t[t > 1], lambda t: bool(t[0] > 0),
    lambda t: torch.empty(int(t.sum())),
], ids=["item", "tolist", "cpu", "int", "nonzero", "bool-mask", "bool", "empty-sum"])
def test_capture_raises_on_host_sync(sync):
    t = torch.tensor([1, 2, 3])
    g = EmulatedGraph()
    with pytest.raises(CaptureSyncError, match="host sync is illegal while capturing"):
        with g.capture():
            sync(t)


def test_a_bool_table_read_at_integer_rows_is_a_gather_not_a_mask():
    """``table[rows]`` with a bool ``table`` and integer rows has a fixed size (no sync), unlike ``t[mask]``."""
    table, rows = torch.tensor([True, False, True]), torch.tensor([2, 1, 0, 1])
    out = torch.zeros(4, dtype=torch.bool)
    g = EmulatedGraph()
    with g.capture():
        out.copy_(table[rows])
    assert out.tolist() == [True, False, True, False]
    rows.copy_(torch.tensor([0, 0, 1, 2]))
    g.replay()
    assert out.tolist() == [True, True, False, True]


def test_triton_launch_is_recorded_and_replayed():
    table = torch.arange(20, dtype=torch.int32).view(4, 5)
    rows = torch.tensor([2, 1])
    lens = torch.tensor([3, 2], dtype=torch.int32)
    indptr = torch.tensor([0, 3, 5], dtype=torch.int32)
    out = torch.full((10,), -1, dtype=torch.int32)
    g = EmulatedGraph()
    with g.capture():
        triton_kernels.ragged_gather(table, rows, lens, indptr, out)
    assert out[:5].tolist() == [10, 11, 12, 5, 6]
    rows.copy_(torch.tensor([0, 3]))
    g.replay()
    assert out[:5].tolist() == [0, 1, 2, 15, 16]


@triton.jit
def _copy_first(src, dst, n_ptr):
    n = tl.load(n_ptr)
    for i in range(0, n):  # a loop whose trip count is read from memory
        tl.store(dst + i, tl.load(src + i))


def test_an_engines_own_triton_launch_is_one_recorded_launch():
    """A kernel launched straight through Triton (an engine's own, not through ``launch``) is recorded as
    one launch, re-run at replay on the captured tensors' new contents, as a CUDA graph records it."""
    src, dst = torch.arange(1, 9, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)
    n = torch.tensor([2], dtype=torch.int32)
    g = EmulatedGraph()
    with g.capture():
        _copy_first[(1,)](src, dst, n)
    assert dst.tolist() == [1, 2, 0, 0, 0, 0, 0, 0] and g.num_ops == 1
    n.fill_(5)
    src.mul_(10)
    g.replay()
    assert dst.tolist() == [10, 20, 30, 40, 50, 0, 0, 0]


def test_replay_before_capture_and_double_capture_are_errors():
    g = EmulatedGraph()
    with pytest.raises(RuntimeError, match="before capture"):
        g.replay()
    with g.capture():
        pass
    with pytest.raises(RuntimeError, match="already captured"):
        with g.capture():
            pass
