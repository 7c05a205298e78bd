"""Real CUDA graphs on the GPU: every backend captured and replayed ==
eager twin, attention == the pool-derived oracle, compiled Triton (not the
interpreter), no device allocation on the replay path, and a staging buffer
that back-to-back steps never clobber."""

import os

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch
from attnmeta.sim import DecodeModel, GraphRunner
from attnmeta.sim.attention import attention_from_pool
from attnmeta.sim.compare import compare_metadata
from attnmeta.sim.triton_attention import TritonDecodeAttention
from tests.batches import make_batch, make_pool
from tests.oracles import padded

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS, MAX_BS, SIZES = 512, 80, 64, (1, 2, 4, 8, 16, 32, 48)
BACKENDS = ["flashinfer", "tbo_flashinfer", "triton", "tbo_triton", "flashattention"]


@pytest.fixture(scope="module", params=BACKENDS)
def setup(request):
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=3, device=dev)
    cb = compile_backend(request.param, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L))
    be = cb.instantiate(pool, device=dev)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(ROWS * L + 1, 4, 64, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 4, 64, generator=g).to(dev)
    runner = GraphRunner(be, DecodeModel(k, v, MAX_BS, L), SIZES, dev)
    runner.capture()
    return request.param, dev, pool, be, runner, k, v


def test_triton_is_compiled_not_interpreted():
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def test_replay_matches_eager_twin_and_reference_attention(setup):
    name, dev, pool, be, runner, k, v = setup
    g = torch.Generator().manual_seed(1)
    twin = get_eager(name)(pool, MAX_BS)
    for step, raw in enumerate([1, 7, 8, 31, 0, 48, 47, 60, 3, 16]):
        fb = make_batch(raw, L, ROWS, seed=step, device=dev) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        q = torch.randn(raw, 4, 64, generator=g).to(dev)
        out = runner.run(fb, q)
        torch.cuda.synchronize()
        if not raw:
            assert out.shape[0] == 0
            continue
        full = padded(fb, runner.padded_size(raw) or raw)
        assert compare_metadata(be.forward_metadata, twin.init_forward_metadata(full), full.seq_lens_cpu) == []
        want = attention_from_pool(q, k, v, pool, fb.req_pool_indices, fb.seq_lens_cpu)
        torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)
    assert runner.stats["eager"] == 1 and runner.stats["replay"] == 9


def test_no_device_allocation_on_replay_path(setup):
    """The replay path allocates nothing: with the output written into the caller's buffer (out=)
    or left in the static one (copy=False). The default, a copy the caller owns, is one allocation."""
    name, dev, pool, be, runner, k, v = setup
    batches = [make_batch(raw, L, ROWS, seed=100 + raw, device=dev) for raw in (5, 12, 30, 5)]
    qs = [torch.randn(fb.batch_size, 4, 64, device=dev) for fb in batches]
    outs = [torch.empty_like(q) for q in qs]
    for fb, q in zip(batches, qs, strict=True):  # warm every size once
        runner.run(fb, q)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(5):
        for fb, q, o in zip(batches, qs, outs, strict=True):
            runner.run(fb, q, out=o)
            runner.run(fb, q, copy=False)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    runner.run(batches[0], qs[0])
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before + 1  # the caller's copy


def test_back_to_back_steps_never_clobber_the_pinned_staging_buffer(setup):
    """Bug class 10: many steps with no host sync between them; every step's metadata is
    snapshotted on the device in stream order and checked at the end."""
    name, dev, pool, be, runner, k, v = setup
    field = "cu_seqlens_k" if name == "flashattention" else "kv_indptr"
    batches = [make_batch(8, L, ROWS, seed=500 + s, device=dev) for s in range(40)]
    snaps = []
    for fb in batches:
        runner.run(fb, torch.zeros(8, 4, 64, device=dev))
        snaps.append(getattr(be.forward_metadata, field)[:9].clone())  # enqueued after the replay
    torch.cuda.synchronize()
    for fb, snap in zip(batches, snaps, strict=True):
        want = torch.zeros(9, dtype=torch.int32)
        want[1:] = torch.cumsum(fb.seq_lens_cpu, 0)
        assert torch.equal(snap.cpu(), want)


def test_triton_decode_attention_bf16_against_fp32_reference():
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=5, device=dev)
    cb = compile_backend("triton", CompileOptions(max_bs=MAX_BS, capture_sizes=(48,), max_context_len=L))
    be = cb.instantiate(pool, device=dev)
    fb = make_batch(48, L, ROWS, seed=6, device=dev)
    be.init_forward_metadata(fb)
    m = be.forward_metadata
    g = torch.Generator().manual_seed(2)
    k = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    q = torch.randn(48, 8, 128, generator=g).to(dev)
    out = torch.empty(48, 8, 128, dtype=torch.bfloat16, device=dev)
    TritonDecodeAttention(MAX_BS, 8, 128, 8, dev)(q.bfloat16(), k.bfloat16(), v.bfloat16(), m.kv_indptr,
                                                 m.kv_indices, m.num_kv_splits, out)
    want = attention_from_pool(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), pool,
                               fb.req_pool_indices, fb.seq_lens_cpu)
    rel = (out.float().cpu() - want).norm() / want.norm()
    assert rel < 1e-2, float(rel)
