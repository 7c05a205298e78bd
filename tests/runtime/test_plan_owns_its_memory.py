"""A plan owns every byte its graphs touch: each storage a captured graph reads or writes, that the capture did not
allocate itself (the emulated graph's record of it: what a CUDA graph holds only by address), is reachable from the
bound plan, so it lives as long as the plan does: the plan's buffers, the engine's pools and, on a graph captured on
an engine's own buffers, those buffers themselves (not a pointer to them), the device record and the engine word.

The failure this rules out, seen on the H100 (two backends on one set of engine buffers, markers allocated after the
captures): a graph's check reading memory a later allocation had taken. A plan that held a captured tensor only
by address would fail here on the CPU, whatever the allocator does."""

import gc
import types

import pytest
import torch

from attnmeta.backends import list_backends
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import EmulatedGraph, ReplayView
from attnmeta.runtime.graphs import storage_key
from tests.batches import make_pool

L, ROWS = 64, 12


def reachable(root, limit: int = 200_000) -> set[int]:
    """Storages of every tensor reachable from ``root`` through references (not through modules, classes or
    module globals: what the object itself keeps alive)."""
    seen, out, todo = set(), set(), [root]
    while todo and len(seen) < limit:
        x = todo.pop()
        if id(x) in seen or isinstance(x, types.ModuleType | type):
            continue
        seen.add(id(x))
        if isinstance(x, torch.Tensor):
            out.add(storage_key(x))
            continue
        if isinstance(x, dict) and "__builtins__" in x:  # a module's globals
            continue
        todo.extend(gc.get_referents(x))
    return out


def engine_view(bs: int, mode, device="cpu") -> ReplayView:
    """A graph runner's own buffers (rows, lengths, their host mirror), which a capture binds in place."""
    seq = torch.full((bs,), 3, dtype=torch.int64, device=device)
    rows = torch.ones(bs, dtype=torch.int64, device=device)
    return ReplayView(bs, mode, mode, bs, req_pool_indices=rows, seq_lens=seq, seq_lens_cpu=seq.cpu().clone())


def unowned(be, b, g: EmulatedGraph) -> list[str]:
    held = reachable(b) | reachable(be.record) | reachable(be.word)
    return [f"{tuple(t.shape)} {t.dtype}" for t in g.external() if storage_key(t) not in held]


@pytest.mark.parametrize("name", ["triton", "flashinfer", "flashattention", "trtllm_mha"])
def test_every_tensor_a_captured_graph_touches_is_held_by_its_plan(name):
    assert name in list_backends()
    cb = compile_backend(name, CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L, page_size=1))
    be = cb.instantiate(make_pool(ROWS, L))
    for bs in (4, 2):
        v = engine_view(bs, ForwardMode.DECODE)
        be.init_forward_metadata_out_graph(v, in_capture=True)
        b = be.bound(ForwardMode.DECODE, bs)
        g = EmulatedGraph()
        with g.capture():
            be.init_forward_metadata_in_graph(v)
        assert b.engine is not None, "captured on the engine's buffers"
        assert g.external(), "the capture recorded what it touched"
        del v
        gc.collect()  # the engine's capture batch gone: what the graph reads must still be owned
        assert unowned(be, b, g) == [], (name, bs)


def test_a_plan_that_held_an_engine_buffer_only_by_address_is_caught():
    """The test's own negative control: drop the plan's reference to the engine buffer it bound (as a plan holding
    a pointer, not the tensor, would) and the captured graph's read of it is reported."""
    cb = compile_backend("triton", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=L))
    be = cb.instantiate(make_pool(ROWS, L))
    v = engine_view(2, ForwardMode.DECODE)
    be.init_forward_metadata_out_graph(v, in_capture=True)
    b = be.bound(ForwardMode.DECODE, 2)
    g = EmulatedGraph()
    with g.capture():
        be.init_forward_metadata_in_graph(v)
    bound = {storage_key(e.tensor) for e in b.engine}
    b.engine = b.step = None
    b.in_args[:] = [x.clone() if isinstance(x, torch.Tensor) and storage_key(x) in bound else x for x in b.in_args]
    assert len(unowned(be, b, g)) == len(bound)
