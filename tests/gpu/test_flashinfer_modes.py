"""Real FlashInfer in every graphed mode: target verify (paged prefill with the drafter's tree mask)
and draft extend (causal paged prefill, T query slots per request), planned by FlashInfer's own
plan() on the compiled buffers, captured in CUDA graphs with the attention and replayed with new
batches, against an fp32 oracle read from the pool."""

import importlib.util
import random

import pytest
import torch

from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter
from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import make_pool
from tests.oracles import masked_attention_from_pool, token_kv_cache

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, D, MAX_BS, SIZES, H, HKV, HD = 1024, 40, 4, 16, (4, 16), 8, 2, 128


def batch(mode, lens, rows, dev):
    seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
    return ForwardBatch(mode, len(lens), req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi,
                        seq_lens=seq.to(dev), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()),
                        extend_seq_lens=torch.ones(len(lens), dtype=torch.int32, device=dev),
                        extend_seq_lens_cpu=torch.ones(len(lens), dtype=torch.int32))


# the default compile with the device planner is checked word for word against plan() in
# test_flashinfer_device_plan.py; here attention runs through the host planner and plan_on_device
@pytest.mark.parametrize("planner", ["host", "plan_on_device"])
@pytest.mark.parametrize("mode", [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND], ids=["verify", "draft"])
def test_flashinfer_prefill_modes_replayed_match_the_oracle(mode, planner):
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=2, device=dev)
    cb = compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                      modes=(mode.name.lower(),), num_draft_tokens=D,
                                                      backend=FlashInferOptions(plan_on_device=planner ==
                                                                                "plan_on_device")))
    be = cb.instantiate(pool, device=dev)
    adapter = FlashInferDecodeAdapter(be, H, HKV, HD, partition="host" if planner == "host" else "device")
    k, v, kv = token_kv_cache(ROWS * L + 1, HKV, HD, 3, dev)
    g = torch.Generator().manual_seed(3 + 100)  # the queries' and masks' draws
    qbuf = torch.zeros(MAX_BS * D, H, HD, dtype=torch.bfloat16, device=dev)
    obuf = torch.zeros_like(qbuf)
    graphs = {}
    for bs in sorted(SIZES, reverse=True):  # largest first: smaller plans reuse the workspace it sized
        fb = batch(mode, [D + 1] * bs, [0] * bs, dev)
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        w = be.forward_metadata.plan
        be.init_forward_metadata_in_graph(fb)
        w.run(qbuf[: bs * D], kv, out=obuf[: bs * D])  # warm-up outside the graph (kernel JIT)
        torch.cuda.synchronize()
        graphs[bs] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bs]):
            be.init_forward_metadata_in_graph(fb)
            w.run(qbuf[: bs * D], kv, out=obuf[: bs * D])
    rng = random.Random(1)
    for step in range(10):
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= raw)
        lens = [rng.choice([D, D + 1, 15, 16, 17, 255, 256, 257, L - D]) if rng.random() < 0.5
                else rng.randint(D, L - D) for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        fb = batch(mode, lens, rows, dev)
        masks = []
        if mode is ForwardMode.TARGET_VERIFY:  # the drafter writes its tree mask before the step
            buf = be.bound(mode, bs).meta.custom_mask
            masks = [torch.rand(D * (n + D), generator=g).to(dev) < 0.6 for n in lens]
            for m in masks:
                m.view(D, -1)[:, 0] = True  # every query sees at least one key
            live = torch.cat(masks)
            buf[: live.numel()] = live
            buf[live.numel() : live.numel() + D * (1 + D) * (bs - raw)] = True  # padded rows
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        q = torch.randn(raw * D, H, HD, generator=g).to(dev).bfloat16()
        qbuf[: raw * D] = q
        qbuf[raw * D : bs * D] = 0
        graphs[bs].replay()
        torch.cuda.synchronize()
        verify = mode is ForwardMode.TARGET_VERIFY  # verify: D queries over seq + D keys, under the tree mask
        want = masked_attention_from_pool(q, k, v, pool, rows, lens, D, D if verify else 0, masks if verify else None)
        got = obuf[: raw * D].float()
        rel = float((got - want).norm() / want.norm())
        assert rel < 1e-2, (step, raw, bs, rel)
    assert all((s.state.device is not None) == (planner != "host") for s in adapter.sites)


def test_a_tbo_child_without_rows_is_not_planned():
    """TBO at a batch of one: child 0 has no rows. FlashInfer's plan() refuses an empty batch, so
    the adapter leaves that child's wrapper unplanned; the other child is planned and replays."""
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=2, device=dev)
    cb = compile_backend("tbo_flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=(1, 4), max_context_len=L))
    be = cb.instantiate(pool, device=dev)
    FlashInferDecodeAdapter(be, H, HKV, HD)
    for bs in (1, 4):
        fb = batch(ForwardMode.DECODE, [7] * bs, list(range(1, bs + 1)), dev)
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        be.init_forward_metadata_in_graph(fb)
        be.init_forward_metadata_out_graph(ReplayView.of(batch(ForwardMode.DECODE, [300] * bs,
                                                               list(range(2, bs + 2)), dev), bs))
        m = be.forward_metadata
        assert m.tbo1_plan is not None and int(m.tbo1_kv_indptr_host[-1]) == 300 * (bs - bs // 2)
