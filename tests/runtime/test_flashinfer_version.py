"""The FlashInfer adapter checks at construction that FlashInfer is there and new enough for the
wrapper API it binds: a clear error then, not a TypeError deep inside the first plan()."""

import sys
import types

import pytest

from attnmeta.runtime.flashinfer_adapter import FlashInferDecodeAdapter, FlashInferVersionError


def test_missing_flashinfer_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # import flashinfer -> ImportError
    with pytest.raises(FlashInferVersionError, match=r"FlashInfer is not installed .*attnmeta\[flashinfer\]"):
        FlashInferDecodeAdapter(object(), 32, 8, 128)


@pytest.mark.parametrize("version", ["0.5.3", "0.2.0+cu124"])
def test_an_old_flashinfer_is_refused(monkeypatch, version):
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__=version))
    with pytest.raises(FlashInferVersionError, match=rf"FlashInfer {version.replace('+', '.')} is older than 0.6"):
        FlashInferDecodeAdapter(object(), 32, 8, 128)


def test_a_workspace_too_small_is_a_clear_error(monkeypatch):
    """FlashInfer's own overflow message deep in plan() becomes a PlanError naming the setting."""
    import torch

    from attnmeta.compiler import CompileOptions, compile_backend
    from attnmeta.runtime import ForwardBatch, ForwardMode
    from attnmeta.runtime.planners import PlanError
    from tests.batches import make_pool

    class Wrapper:
        def __init__(self, *a, **k):
            pass

        def plan(self, *a, **k):
            raise RuntimeError("Error in function 'aligned_alloc': Buffer overflow when allocating memory for "
                               "batch_prefill_tmp_v with size 601882624 and alignment 16, but only 402653184 "
                               "bytes available in AlignedAllocator. Increase the workspace buffer size.")

    fake = types.SimpleNamespace(__version__="0.6.4", BatchDecodeWithPagedKVCacheWrapper=Wrapper)
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    be = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=64)).instantiate(
        make_pool(6, 64, 1))
    FlashInferDecodeAdapter(be, 32, 8, 128, workspace_bytes=1 << 20)
    seq = torch.tensor([5, 9], dtype=torch.int32)
    fb = ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=torch.tensor([1, 2]), seq_lens=seq, seq_lens_cpu=seq,
                      seq_lens_sum=14)
    with pytest.raises(PlanError, match=r"workspace \(1 MiB\) is too small .*only 402653184 bytes.*workspace_bytes="):
        be.init_forward_metadata(fb)
