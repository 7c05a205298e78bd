"""Deliberately broken backends: the CUDA-graph bugs engines ship are
caught, by the emulated graph (stale data at replay) or by the runtime."""

import pytest
import torch

from attnmeta.backends.eager import get_eager
from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.runtime import CompiledAttentionBackend, EmulatedGraph, ReplayView, StaleBufferError
from tests.batches import make_batch, make_pool

L, ROWS, BS = 32, 16, 4


class RebindingBackend(CompiledAttentionBackend):
    """Bug class 1/2: stages seq_lens into a *fresh* tensor each step and rebinds
    the plan to it, instead of writing the captured buffer in place."""

    def _stage(self, fb, b):
        super()._stage(fb, b)
        i = b.plan.in_args.index("seq_lens")
        fresh = b.in_args[i].clone()
        self.inputs["seq_lens"] = fresh  # what a hand-written backend does: rebuild, rebind
        b.in_args[i] = fresh


def capture_then_replay(backend_cls, check_addresses):
    pool = make_pool(ROWS, L, seed=0)
    compiled = compile_backend("flashinfer", CompileOptions(max_bs=8, capture_sizes=(BS,), max_context_len=L))
    be = backend_cls(compiled, pool, check_addresses=check_addresses)
    cap = make_batch(BS, L, ROWS, seed=1, max_len=4)
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    g = EmulatedGraph()
    with g.capture():
        be.init_forward_metadata_in_graph(cap)
    fb = make_batch(BS, L, ROWS, seed=2)
    be.init_forward_metadata_out_graph(ReplayView.of(fb, BS))
    g.replay()
    ref = get_eager("flashinfer")(pool, 8).init_forward_metadata(fb)
    return be.forward_metadata, ref


def test_correct_backend_replays_new_data():
    meta, ref = capture_then_replay(CompiledAttentionBackend, check_addresses=True)
    assert torch.equal(meta.kv_indptr, ref.kv_indptr)


def test_rebinding_is_caught_by_the_emulated_graph():
    meta, ref = capture_then_replay(RebindingBackend, check_addresses=False)
    # the graph still read the captured seq_lens: the replayed indptr is the capture-time one
    assert not torch.equal(meta.kv_indptr, ref.kv_indptr)
    assert int(meta.kv_indptr[-1]) <= BS * 4


def test_rebinding_is_caught_by_the_address_check():
    with pytest.raises(StaleBufferError, match=r"\['seq_lens'\].*rebound after capture.*copy_"):
        capture_then_replay(RebindingBackend, check_addresses=True)
