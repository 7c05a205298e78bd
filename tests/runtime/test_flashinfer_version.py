"""The FlashInfer adapter checks at construction that FlashInfer is there and new enough for the
wrapper API it binds: a clear error then, not a TypeError deep inside the first plan()."""

import sys
import types

import pytest

from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter
from attnmeta.backends.flashinfer_lib import FlashInferVersionError


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

    from attnmeta.backends.reference import PlanError
    from attnmeta.compiler import CompileOptions, compile_backend
    from attnmeta.runtime import ForwardBatch, ForwardMode
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


def _wrapper(tensor_cores: bool, calls: list):
    import torch

    module = types.SimpleNamespace(plan=lambda *a: calls.append(a) or "info")
    return types.SimpleNamespace(use_tensor_cores=tensor_cores, _backend="fa2", _jit_module=None,
                                 _cached_module=module, _float_workspace_buffer="f", _int_workspace_buffer="i",
                                 _pin_memory_int_workspace_buffer="p", _cached_q_data_type=torch.bfloat16,
                                 _cached_kv_data_type=torch.bfloat16, _logits_soft_cap=0.0, _plan_info=None)


def test_the_lean_planner_calls_the_planner_with_plans_arguments():
    """What the lean planner hands FlashInfer's C++ planner, as plan() assembles it in 0.6: the
    lengths from the host indptr (pages of one token), the query indptr 0..bs, graph mode."""
    import torch

    from attnmeta.backends.flashinfer.planner import lean_planner

    calls = []
    w = _wrapper(True, calls)
    plan = lean_planner(types.SimpleNamespace(__version__="0.6.4"), w, (32, 8, 128), 3)
    plan(torch.tensor([0, 5, 5, 12], dtype=torch.int32))
    a = calls[-1]
    assert a[:3] == ("f", "i", "p") and a[3].tolist() == [0, 1, 2, 3] and a[5].tolist() == [5, 0, 7]
    assert a[6:] == (3, 3, 32, 8, 1, True, 128, 128, False, -1, -1, False, 0)
    assert w._plan_info == "info" and w._max_kv_len == 7
    w2 = _wrapper(False, calls)
    lean_planner(types.SimpleNamespace(__version__="0.6.4"), w2, (32, 8, 128), 3)(torch.tensor([0, 1, 2, 3]))
    assert calls[-1][4:13] == (3, 32, 8, 1, True, -1, 0.0, 128, 128)


@pytest.mark.parametrize("version", ["0.7.0", "0.5.9"])
def test_another_flashinfer_plans_through_plan(version):
    """Only the versions whose plan() internals it repeats get the lean planner; the rest plan()."""
    from attnmeta.backends.flashinfer.planner import lean_planner

    assert lean_planner(types.SimpleNamespace(__version__=version), _wrapper(True, []), (32, 8, 128), 3) is None
