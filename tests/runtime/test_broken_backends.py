"""Deliberately broken backends: the CUDA-graph bugs engines ship are
caught, by the emulated graph (stale data at replay) or by the runtime."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.runtime import CompiledAttentionBackend, ReplayView, StaleBufferError
from tests.batches import capture, make_batch, make_pool

L, ROWS, BS = 32, 16, 4


class RebindingBackend(CompiledAttentionBackend):
    """Bug classes 1/2: at replay, seq_lens is rebuilt into a fresh tensor and the
    backend rebinds to it; the buffer the graph captured keeps its old values."""

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        if in_capture:
            return super().init_forward_metadata_out_graph(fb, in_capture)
        b = self.bound(fb.forward_mode, fb.batch_size)
        k = next(i for i, a in enumerate(b.binding.in_args) if a.name == "seq_lens")
        captured = b.in_args[k]
        saved = captured.clone()
        b.in_args[k] = fresh = captured.clone()  # rebound before out_graph runs, as a hand-written backend does
        super().init_forward_metadata_out_graph(fb, in_capture)
        fresh.copy_(captured)  # the new values live only in the fresh tensor...
        captured.copy_(saved)  # ...the captured buffer was never written


def capture_then_replay(backend_cls, check_addresses):
    pool = make_pool(ROWS, L, seed=0)
    compiled = compile_backend("flashinfer", CompileOptions(max_bs=8, capture_sizes=(BS,), max_context_len=L))
    be = backend_cls(compiled, pool, check_addresses=check_addresses)
    cap = make_batch(BS, L, ROWS, seed=1, max_len=4)
    g = capture(be, cap)
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
