"""Real CUDA graphs on the GPU: capture/replay == eager twin, compiled
Triton (not the interpreter), no device allocation on the replay path."""

import os

import pytest
import torch

from attnmeta.backends.eager import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import DecodeModel, ForwardBatch, GraphRunner, decode_attention_loop
from tests.batches import make_batch, make_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS, MAX_BS, SIZES = 512, 80, 64, (1, 2, 4, 8, 16, 32, 48)


@pytest.fixture(scope="module", params=["flashinfer", "tbo_flashinfer"])
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
    return dev, pool, be, runner, k, v


def test_triton_is_compiled_not_interpreted():
    assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def test_replay_matches_eager_twin_and_reference_attention(setup):
    dev, pool, be, runner, k, v = setup
    g = torch.Generator().manual_seed(1)
    for step, raw in enumerate([1, 7, 8, 31, 0, 48, 47, 60, 3, 16]):
        fb = make_batch(raw, L, ROWS, seed=step, device=dev) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        q = torch.randn(raw, 4, 64, generator=g).to(dev)
        out = runner.run(fb, q)
        torch.cuda.synchronize()
        if not raw:
            assert out.shape[0] == 0
            continue
        ref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(fb)
        m = be.forward_metadata
        n = int(ref.kv_indptr[-1])
        assert torch.equal(m.kv_indptr[: raw + 1], ref.kv_indptr)
        assert torch.equal(m.kv_indices[:n], ref.kv_indices)
        assert torch.equal(m.kv_indptr_host[: raw + 1], ref.kv_indptr_host)
        want = decode_attention_loop(q, k, v, ref.kv_indptr, ref.kv_indices)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        if hasattr(m, "tbo0_kv_indptr") and raw == runner.padded_size(raw):  # unpadded: children are the halves
            half = raw // 2
            for c, (lo, hi) in enumerate([(0, half), (half, raw)]):
                sub = ForwardBatch(ForwardMode.DECODE, hi - lo, req_pool_indices=fb.req_pool_indices[lo:hi],
                                   seq_lens=fb.seq_lens[lo:hi], seq_lens_cpu=fb.seq_lens_cpu[lo:hi])
                cref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(sub)
                assert torch.equal(getattr(m, f"tbo{c}_kv_indptr"), cref.kv_indptr)
                cn = int(cref.kv_indptr[-1])
                assert torch.equal(getattr(m, f"tbo{c}_kv_indices")[:cn], cref.kv_indices)
    assert runner.stats["eager"] == 1 and runner.stats["replay"] == 9


def test_no_device_allocation_on_replay_path(setup):
    dev, pool, be, runner, k, v = setup
    batches = [make_batch(raw, L, ROWS, seed=100 + raw, device=dev) for raw in (5, 12, 30, 5)]
    qs = [torch.randn(fb.batch_size, 4, 64, device=dev) for fb in batches]
    for fb, q in zip(batches, qs, strict=True):  # warm every size once
        runner.run(fb, q)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    for _ in range(5):
        for fb, q in zip(batches, qs, strict=True):
            runner.run(fb, q)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before


def test_back_to_back_steps_never_clobber_the_pinned_staging_buffer(setup):
    """Bug class 10: many steps with no host sync between them; every step's metadata is
    snapshotted on the device in stream order and checked at the end."""
    dev, pool, be, runner, k, v = setup
    batches = [make_batch(8, L, ROWS, seed=500 + s, device=dev) for s in range(40)]
    qs = [torch.zeros(8, 4, 64, device=dev) for _ in batches]
    snaps = []
    for fb, q in zip(batches, qs, strict=True):
        runner.run(fb, q)
        snaps.append(be.forward_metadata.kv_indptr[:9].clone())  # enqueued after the replay
    torch.cuda.synchronize()
    for fb, snap in zip(batches, snaps, strict=True):
        want = torch.zeros(9, dtype=torch.int32)
        want[1:] = torch.cumsum(fb.seq_lens_cpu, 0)
        assert torch.equal(snap.cpu(), want)
