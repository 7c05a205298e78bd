"""Real FlashInfer MLA over attnmeta's metadata (DeepSeek shapes: 128 query heads, a compressed KV of
512 and a rope key of 64, one latent KV head): decode and target verify planned by
``FlashInferMLAAdapter`` on the compiled buffers, captured in CUDA graphs with the attention and
replayed with new batches, against an fp32 oracle read from the pool; and every step's plan equal,
word for word in the int workspace, to FlashInfer's own ``plan()`` of the same batch."""

import importlib.util
import random

import pytest
import torch

from attnmeta.backends.flashinfer_mla.device_plan import MLADevicePlanner, MLALayout, read_regions
from attnmeta.backends.flashinfer_mla.planner import FlashInferMLAAdapter
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import make_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, D, MAX_BS, SIZES, H, CKV, KPE = 2048, 40, 4, 16, (4, 16), 128, 512, 64
SCALE = (128 + KPE) ** -0.5  # DeepSeek-V3's unabsorbed head (nope 128 + rope 64)


def batch(mode, lens, rows, dev):
    seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
    return ForwardBatch(mode, len(lens), req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi,
                        seq_lens=seq.to(dev), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))


def oracle(q_nope, q_pe, ckv, kpe, pool, rows, lens, q_per_req, causal):
    """fp32 MLA: each query row of request i attends its keys (token slots pool[row, :kv_len]); with
    ``causal``, query t of q sees the first kv_len - q + t + 1 of them."""
    out = []
    for i, (r, n) in enumerate(zip(rows, lens, strict=True)):
        slots = pool[r, :n].long()
        c, p = ckv[slots].float(), kpe[slots].float()  # [n, CKV], [n, KPE]
        for t in range(q_per_req):
            z = i * q_per_req + t
            see = n - q_per_req + t + 1 if causal else n
            logits = (q_nope[z].float() @ c[:see].T + q_pe[z].float() @ p[:see].T) * SCALE  # [H, see]
            out.append(torch.softmax(logits, -1) @ c[:see])
    return torch.stack(out)


@pytest.mark.parametrize("page", [1, 64])
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY], ids=["decode", "verify"])
def test_mla_replayed_over_attnmeta_metadata_matches_the_oracle_and_plan(mode, page):
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=2, device=dev)
    verify = mode is ForwardMode.TARGET_VERIFY
    q_per_req = D if verify else 1
    cb = compile_backend("flashinfer_mla", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                          modes=(mode.name.lower(),), num_draft_tokens=D,
                                                          page_size=page))
    be = cb.instantiate(pool, device=dev)
    adapter = FlashInferMLAAdapter(be, H, CKV, KPE, sm_scale=SCALE, partition="device")
    g = torch.Generator().manual_seed(3)
    slots = ROWS * L + 1
    ckv = (torch.randn(slots, CKV, generator=g) * 0.5).to(dev).bfloat16()
    kpe = (torch.randn(slots, KPE, generator=g) * 0.5).to(dev).bfloat16()
    caches = (ckv.view(-1, 1, CKV), kpe.view(-1, 1, KPE))  # FlashInfer reads token slots: pages of one token
    qn = torch.zeros(MAX_BS * q_per_req, H, CKV, dtype=torch.bfloat16, device=dev)
    qp = torch.zeros(MAX_BS * q_per_req, H, KPE, dtype=torch.bfloat16, device=dev)
    out = torch.zeros_like(qn)
    graphs = {}
    for bs in sorted(SIZES, reverse=True):
        fb = batch(mode, [D + 1] * bs, [0] * bs, dev)
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        w = be.forward_metadata.plan
        be.init_forward_metadata_in_graph(fb)
        n = bs * q_per_req
        w.run(qn[:n], qp[:n], *caches, out=out[:n])  # warm-up outside the graph (kernel JIT)
        torch.cuda.synchronize()
        graphs[bs] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bs]):
            be.init_forward_metadata_in_graph(fb)
            w.run(qn[:n], qp[:n], *caches, out=out[:n])
    rng, worst = random.Random(1), 0.0
    for step in range(8):
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= raw)
        lens = [rng.choice([D, D + 1, 63, 64, 65, L - D]) if rng.random() < 0.5 else rng.randint(D, L - D)
                for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        fb = batch(mode, lens, rows, dev)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        n = raw * q_per_req
        qn[:n] = torch.randn(n, H, CKV, generator=g).to(dev).bfloat16()
        qp[:n] = torch.randn(n, H, KPE, generator=g).to(dev).bfloat16()
        graphs[bs].replay()
        torch.cuda.synchronize()
        w = be.forward_metadata.plan
        mine = w._int_workspace_buffer.clone()
        kv_lens = [x + D if verify else x for x in lens]
        want = oracle(qn[:n], qp[:n], ckv, kpe, pool, rows, kv_lens, q_per_req, causal=verify)
        rel = (out[:n].float() - want).norm() / want.norm()
        worst = max(worst, float(rel))
        assert rel < 1e-2, (step, float(rel))
        # FlashInfer's own plan() of this step on the same wrapper (host arrays from the batch, not from
        # the compiled fields): the same work items, word for word, where the kernel reads them (the
        # partition was planned on the GPU: past the live items each side leaves its own stale words)
        pad = [1 + D if verify else 1] * (bs - raw)  # padded rows: the fill length 1 (+ the drafts)
        kv_host = torch.tensor([0, *torch.tensor(kv_lens + pad).cumsum(0).tolist()], dtype=torch.int32)
        qo_host = torch.arange(0, (bs + 1) * q_per_req, q_per_req, dtype=torch.int32)
        site = be.bound(mode, bs).sites["plan"]
        assert site in adapter.sites and site.state.device is not None and site.state.lean is not None
        layout = site.state.device.layout
        w.plan(qo_host, kv_host, site.state.empty, kv_host[1:] - kv_host[:-1], H, CKV, KPE, 1, verify, SCALE,
               torch.bfloat16, torch.bfloat16)
        torch.cuda.synchronize()
        want = w._int_workspace_buffer.view(torch.int32)
        for at, k in read_regions(layout, want):
            assert torch.equal(mine.view(torch.int32)[at:at + k], want[at:at + k]), (step, at)
    print(f"\nflashinfer_mla {mode.name.lower()} page {page}: worst relative error against fp32 {worst:.2e}")


@pytest.mark.parametrize("verify", [False, True], ids=["decode", "verify"])
def test_the_device_partition_is_flashinfers_word_for_word(verify):
    """The in-graph MLA planner against FlashInfer's ``plan()`` alone, batch sizes 1 to 256 with
    lengths from 1 to 32k (splits, long among short, all equal), and its GPU time per launch."""
    import flashinfer

    dev, q = torch.device("cuda"), D if verify else 1
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rng, times = random.Random(7), {}
    for bs in (1, 7, 64, 256):
        qo = torch.arange(bs + 1, dtype=torch.int32) * q
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
        w = flashinfer.BatchMLAPagedAttentionWrapper(
            ws, use_cuda_graph=True, qo_indptr=torch.empty(bs + 1, dtype=torch.int32, device=dev),
            kv_indptr=torch.empty(bs + 1, dtype=torch.int32, device=dev),
            kv_indices=torch.empty(bs * 32768 + 64, dtype=torch.int32, device=dev),
            kv_len_arr=torch.empty(bs, dtype=torch.int32, device=dev), backend="auto")
        for trial in range(6):
            lens = torch.tensor([rng.choice([q, q + 1, 2048, 32768]) if trial % 2 else rng.randint(q, 8192)
                                 for _ in range(bs)] if trial < 5 else [4096] * bs, dtype=torch.int32)
            kv = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0, dtype=torch.int32)])
            w.plan(qo, kv, torch.empty(0, dtype=torch.int32, device=dev), lens, H, CKV, KPE, 1, verify, SCALE,
                   torch.bfloat16, torch.bfloat16)
            torch.cuda.synchronize()
            layout = MLALayout.of(w._plan_info, bs, H, verify, sms)
            assert layout is not None, list(w._plan_info)
            mine = w._int_workspace_buffer.clone()
            planner = MLADevicePlanner(layout, qo.to(dev), kv.to(dev), lens.to(dev), mine, q)
            planner()
            torch.cuda.synchronize()
            want = w._int_workspace_buffer.view(torch.int32)
            for at, k in read_regions(layout, want):
                assert torch.equal(mine.view(torch.int32)[at:at + k], want[at:at + k]), (bs, trial, at)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            planner()
        end.record()
        torch.cuda.synchronize()
        times[bs] = start.elapsed_time(end) / 20 * 1e3
    print(f"\nin-graph MLA planner, {'verify' if verify else 'decode'}: GPU us per launch by bs "
          + ", ".join(f"{b}: {t:.0f}" for b, t in times.items()))
