"""FlashInfer under the batches SGLang serves: every captured size up to 256, lengths uniform in
1..2048 and long ones mixed with one-token ones, page sizes 1 and 16 in the pool, 32 query / 8 KV
heads of 128 (tensor-core decode) and 8 / 8 (CUDA-core decode), bf16, back-to-back replays with no
host sync between them, then the eager path at the same sizes. Attention is checked against the
fp32 oracle read from the pool on every replay's rows; a fault (an illegal address in the partition
kernel or in FlashInfer's kernels reading its plan) fails the run. ``compute-sanitizer --tool memcheck``
runs this file on the H200 (docs/RELIABILITY.md)."""

import importlib.util
import random

import pytest
import torch

from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, new_graph
from attnmeta.sim.attention import attention_from_pool
from attnmeta.sim.flashinfer_attention import run_decode

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, SIZES, HD = 4096, 300, (1, 8, 64, 256), 128


def paged_pool(P: int, seed: int, dev) -> torch.Tensor:
    """req_to_token as SGLang's paged allocator fills it: whole pages per row, page 0 unused, row 0 zero."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.randperm(ROWS * L // P, generator=g)[: (ROWS - 1) * (L // P)].view(ROWS - 1, L // P) + 1
    t = torch.zeros(ROWS, L, dtype=torch.int32)
    t[1:] = (pages.repeat_interleave(P, dim=1) * P + torch.arange(L) % P).to(torch.int32)
    return t.to(dev)


def batch(bs: int, rng: random.Random, dev, long_mix: bool, host_rows: bool = True) -> ForwardBatch:
    """``host_rows=False``: the request rows on the device only, as SGLang's replay view has them."""
    lens = [rng.choice([1, 2, 2048, rng.randint(1, 2048)]) if long_mix else rng.randint(1, 2048) for _ in range(bs)]
    seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rng.sample(range(1, ROWS), bs))
    return ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi
                        if host_rows else None, seq_lens=seq.to(dev), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))


@pytest.mark.parametrize("host_rows", [True, False], ids=["host-rows", "device-rows"])
@pytest.mark.parametrize("P", [1, 16])
@pytest.mark.parametrize("heads", [(32, 8), (8, 8)], ids=["tensor-cores", "cuda-cores"])
def test_sglang_shaped_batches_every_size_back_to_back(P, heads, host_rows):
    dev, (H, HKV) = torch.device("cuda"), heads
    pool = paged_pool(P, 3, dev)
    be = compile_backend("flashinfer", CompileOptions(max_bs=max(SIZES), capture_sizes=SIZES, max_context_len=L,
                                                      page_size=P, num_heads=H, num_kv_heads=HKV)).instantiate(
        pool, device=dev)
    adapter = FlashInferDecodeAdapter(be, H, HKV, HD)
    slots = int(pool.max()) + 1
    gd = torch.Generator(device=dev).manual_seed(1)
    k = torch.randn(slots, HKV, HD, generator=gd, device=dev, dtype=torch.bfloat16)
    v = torch.randn(slots, HKV, HD, generator=gd, device=dev, dtype=torch.bfloat16)
    graphs, outs, qs = {}, {}, {}
    rng = random.Random(5)
    for bs in SIZES:  # capture: the metadata kernel, the partition planned after it, the attention
        fb = batch(bs, rng, dev, False)
        qs[bs] = torch.zeros(bs, H, HD, device=dev, dtype=torch.bfloat16)
        outs[bs] = torch.empty_like(qs[bs])
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        run_decode(be.forward_metadata.plan, qs[bs], k, v, outs[bs])  # warm FlashInfer's kernels
        g = graphs[bs] = new_graph(dev)
        with g.capture():
            be.init_forward_metadata_in_graph(fb)
            run_decode(be.forward_metadata.plan, qs[bs], k, v, outs[bs])
    torch.cuda.synchronize()
    checks = []
    for step in range(24):  # back to back: no sync until the end
        bs = SIZES[step % len(SIZES)] if step < 8 else rng.choice(SIZES)
        fb = batch(bs, rng, dev, long_mix=step % 2 == 1, host_rows=host_rows)
        q = torch.randn(bs, H, HD, device=dev, generator=gd, dtype=torch.bfloat16)
        qs[bs].copy_(q)
        be.init_forward_metadata_out_graph(fb)
        graphs[bs].replay()
        checks.append((fb, q, outs[bs].clone()))
    for bs in SIZES:  # and eagerly
        fb = batch(bs, rng, dev, True)
        q = torch.randn(bs, H, HD, device=dev, generator=gd, dtype=torch.bfloat16)
        be.init_forward_metadata(fb)
        o = torch.empty_like(q)
        run_decode(be.forward_metadata.plan, q, k, v, o)
        checks.append((fb, q, o))
    torch.cuda.synchronize()
    assert all(s.state.device is not None for s in adapter.sites)  # planned on the GPU throughout
    for fb, q, out in checks:
        rows = sorted(random.Random(fb.batch_size).sample(range(fb.batch_size), min(4, fb.batch_size)))
        want = attention_from_pool(q[rows].float(), k, v, pool, fb.req_pool_indices.cpu()[rows],
                                   fb.seq_lens_cpu[rows])
        rel = (out[rows].float().cpu() - want).norm() / want.norm()
        assert rel < 1e-2, (fb.batch_size, float(rel))
