"""FlashInfer's XQA decode, no planner: it reads the flashattention spec's recorded page table and
lengths (uint32 view), captured with the metadata in one CUDA graph and replayed with new batches,
pages of 16/32/64, sequences up to 32k, against an fp32 oracle read from the pool."""

import importlib.util
import random

import pytest
import torch

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.runtime import ForwardBatch, ForwardMode
from attnmeta.sim import DecodeModel, GraphRunner

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, MAX_BS, SIZES, H, HKV, HD = 32768, 20, 16, (4, 16), 32, 8, 128


def paged_pool(P: int, dev):
    """req_to_token as a paged allocator fills it: each row whole pages, page 0 unused."""
    g = torch.Generator().manual_seed(P)
    pages = torch.randperm(ROWS * L // P, generator=g).view(ROWS, L // P) + 1
    t = (pages.repeat_interleave(P, dim=1) * P + torch.arange(L) % P).to(torch.int32)
    t[0] = 0
    return t.to(dev)


def oracle(q, k, v, pool, rows, lens):
    outs = []
    for i, (r, n) in enumerate(zip(rows, lens, strict=True)):
        idx = pool[r, :n].long()
        kk = k[idx].float().repeat_interleave(H // HKV, 1)
        vv = v[idx].float().repeat_interleave(H // HKV, 1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[i].float(), kk) * HD ** -0.5, -1)
        outs.append(torch.einsum("hn,nhd->hd", p, vv))
    return torch.stack(outs)


@pytest.mark.parametrize("P", [16, 32, 64])
def test_xqa_reads_the_recorded_page_table(P):
    from attnmeta.sim.flashinfer_attention import XQADecode

    dev = torch.device("cuda")
    pool = paged_pool(P, dev)
    g, gd = torch.Generator().manual_seed(1), torch.Generator(device=dev).manual_seed(1)
    slots = (ROWS * L // P + 1) * P
    # drawn on the GPU: 650k slots x 8 heads x 128 drawn on the host cost seconds per pool
    k = torch.randn(slots, HKV, HD, generator=gd, device=dev, dtype=torch.bfloat16)
    v = torch.randn(slots, HKV, HD, generator=gd, device=dev, dtype=torch.bfloat16)
    cb = compile_backend("flashattention", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                          page_size=P))
    be = cb.instantiate(pool, device=dev)
    runner = GraphRunner(be, DecodeModel(k, v, MAX_BS, L, page_size=P, q_heads=H, xqa=XQADecode(dev)), SIZES, dev)
    runner.capture()
    rng = random.Random(P)
    for step, raw in enumerate([16, 3, 1, 9, 4, 12]):
        lens = [rng.choice([1, P - 1, P, P + 1, 4096, L]) if rng.random() < 0.5 else rng.randint(1, L)
                for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
        fb = ForwardBatch(ForwardMode.DECODE, raw, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi,
                          seq_lens=seq.to(dev), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        q = torch.randn(raw, H, HD, generator=g).to(dev).bfloat16()
        out = runner.run(fb, q)
        torch.cuda.synchronize()
        want = oracle(q, k, v, pool, rows, lens)
        rel = float((out.float() - want).norm() / want.norm())
        assert rel < 1e-2, (P, step, raw, rel)
    assert runner.stats["replay"] == 6
