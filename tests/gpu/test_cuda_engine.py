"""The engine configuration on real CUDA graphs: every backend compiled with every mode it serves,
modes interleaved step by step (tests/engine.py), checked against the interpreter and the eager
twin; and bad batches that used to be an illegal memory access are refused on the host, or guarded
on the device, with the CUDA context alive for the next batch."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import BatchError, ForwardBatch
from tests.batches import make_batch, make_pool
from tests.engine import BACKENDS, build, interleave

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("name", BACKENDS)
def test_interleaved_modes_on_cuda_graphs(name):
    eng = build(name, device="cuda", max_bs=12, sizes=(1, 2, 4, 8), L=256, rows=24)
    failures = interleave(eng, 150, seed=5)
    torch.cuda.synchronize()
    assert failures == [], failures[:3]
    assert eng.stats["replay"] and eng.stats["eager"]


def _good(be, L, rows):
    fb = make_batch(3, L, rows, seed=4, device="cuda", max_len=L // 2)
    be.init_forward_metadata(fb)
    torch.cuda.synchronize()  # the context is alive: work still runs and completes
    want = torch.nn.functional.pad(torch.cumsum(fb.seq_lens_cpu, 0, dtype=torch.int32), (1, 0))
    assert torch.equal(be.forward_metadata.kv_indptr[:4].cpu(), want)


@pytest.mark.parametrize("bad", [-1, 80, 10**9])
def test_an_index_outside_the_pool_is_a_batch_error_and_the_context_survives(bad):
    L, rows = 256, 16
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    be = cb.instantiate(make_pool(rows, L, device="cuda"), device="cuda")
    fb = make_batch(3, L, rows, seed=1, device="cuda")
    fb.req_pool_indices_cpu = fb.req_pool_indices_cpu.clone()
    fb.req_pool_indices_cpu[1] = bad
    fb.req_pool_indices[1] = bad
    with pytest.raises(BatchError, match=rf"req_pool_indices_cpu\[1\] = {bad} is not a request row"):
        be.init_forward_metadata(fb)
    _good(be, L, rows)


def test_device_lengths_without_their_host_mirror_are_guarded_and_reported():
    """Lengths the engine has on the device only (SGLang's EAGLE drafter without host mirrors) are checked
    on the device: a length past the context is clamped before any kernel reads it, and a later step
    raises a BatchError naming the field, row and value."""
    L, rows = 64, 8
    cb = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    be = cb.instantiate(make_pool(rows, L, device="cuda"), device="cuda")
    fb = make_batch(3, L, rows, seed=1, device="cuda")
    fb.seq_lens = torch.tensor([2, 16000, 3], dtype=torch.int32, device="cuda")
    fb.seq_lens_cpu = None
    be.init_forward_metadata(fb)
    torch.cuda.synchronize()
    with pytest.raises(BatchError, match=r"seq_lens\[1\] = 16000 from the device, outside its range"):
        be.init_forward_metadata(make_batch(3, L, rows, seed=2, device="cuda"))
    _good(be, L, rows)


def test_garbage_in_device_only_fields_is_guarded_on_the_device():
    """DSV4's out_cache_loc exists only on the device: an out-of-range slot reads the reserved entry
    instead of faulting, and the next step raises a BatchError naming the first one."""
    from attnmeta.backends.dsv4.eager import swa_table

    L, rows = 600, 8
    cb = compile_backend("dsv4", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    f2s = swa_table(rows * L + 1, "cuda")
    be = cb.instantiate(make_pool(rows, L, device="cuda"), device="cuda", pools={"full_to_swa": f2s})
    fb = make_batch(3, L, rows, seed=2, device="cuda")
    fb.out_cache_loc = torch.tensor([-5, 10**12, 7], device="cuda")
    be.init_forward_metadata(fb)
    torch.cuda.synchronize()
    assert be.forward_metadata.swa_out_cache_loc[:3].tolist() == [int(f2s[0]), int(f2s[0]), int(f2s[7])]
    with pytest.raises(BatchError, match=r"out_cache_loc\[0\] = -5 from the device, outside its range"):
        be.init_forward_metadata(ForwardBatch(ForwardMode.IDLE, 0))  # the first bad value, reported once
    be.init_forward_metadata(ForwardBatch(ForwardMode.IDLE, 0))
    torch.cuda.synchronize()
