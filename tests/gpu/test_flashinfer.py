"""FlashInfer graph-mode decode wrappers on the compiled backend's static
buffers: captured and replayed against the fp32 pool oracle (bf16)."""

import importlib.util

import pytest
import torch

from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter
from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch
from attnmeta.sim import DecodeModel, GraphRunner
from attnmeta.sim.attention import attention_from_pool, draft_attention_from_pool
from tests.batches import make_batch, make_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, MAX_BS, SIZES = 1024, 80, 64, (1, 8, 16, 64)


@pytest.mark.parametrize("planner", ["device", "host", "plan_on_device"])
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tensor-cores", "cuda-cores"])
def test_flashinfer_replay_matches_the_oracle(tensor_cores, planner):
    """Captured, then replayed with new lengths, for both decode kernels: every replay after the first
    plans on the GPU inside the graph (``device``; ``plan_on_device``: compiled with no host indptr at
    all) or through the lean host planner (FlashInfer's C++ planner alone)."""
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=4, device=dev)
    cb = compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                      backend=FlashInferOptions(plan_on_device=planner ==
                                                                                "plan_on_device")))
    be = cb.instantiate(pool, device=dev)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    adapter = FlashInferDecodeAdapter(be, 8, 2, 128, use_tensor_cores=tensor_cores,
                                      partition="host" if planner == "host" else "device")
    runner = GraphRunner(be, DecodeModel(k.bfloat16(), v.bfloat16(), MAX_BS, L, q_heads=8), SIZES, dev)
    runner.capture()  # largest first: later, smaller plans reuse a workspace a larger plan wrote
    for step, raw in enumerate([64, 5, 16, 1, 0, 60, 9]):
        fb = make_batch(raw, L, ROWS, seed=step, device=dev) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        q = torch.randn(raw, 8, 128, generator=g).to(dev)
        out = runner.run(fb, q.bfloat16())
        torch.cuda.synchronize()
        if raw:
            want = attention_from_pool(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), pool,
                                       fb.req_pool_indices, fb.seq_lens_cpu)
            rel = (out.float().cpu() - want).norm() / want.norm()
            assert rel < 1e-2, (step, float(rel))
    assert runner.stats["replay"] == 7
    on_device = [s.state.device is not None for s in adapter.sites]
    assert on_device == [planner != "host"] * len(on_device)  # every wrapper took the path asked for
    assert all(s.state.lean is not None for s in adapter.sites) == (planner == "host")


@pytest.mark.parametrize("topk", [1, 2])
def test_multistep_draft_steps_through_flashinfer(topk):
    """The drafter's S steps (and K branches), one graph-mode wrapper per step on that step's
    buffers, captured and replayed: each branch attends to its prefix plus its own drafts."""
    from attnmeta.sim import DraftModel, DraftRunner

    dev, S, sizes = torch.device("cuda"), 3, (4, 16)
    pool = make_pool(ROWS, L, seed=5, device=dev)
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=16, capture_sizes=sizes, max_context_len=L,
                                                               num_steps=S, topk=topk))
    be = cb.instantiate(pool, device=dev)
    g = torch.Generator().manual_seed(1)
    k = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    FlashInferDecodeAdapter(be, 8, 2, 128)
    runner = DraftRunner(be, DraftModel(k.bfloat16(), v.bfloat16(), 16, L, S, topk=topk, q_heads=8), sizes, dev)
    runner.capture()
    for step, raw in enumerate([16, 3]):
        fb = make_batch(raw, L, ROWS, seed=step, device=dev, max_len=L - topk * S)
        q = torch.randn(raw, *([topk] if topk > 1 else []), 8, 128, generator=g).to(dev)
        out = runner.run(fb, q.bfloat16())
        torch.cuda.synchronize()
        want = draft_attention_from_pool(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), pool.cpu(),
                                         fb.req_pool_indices.cpu(), fb.seq_lens_cpu, S, topk)
        rel = (out.float().cpu() - want).norm() / want.norm()
        assert rel < 1e-2, (step, float(rel))
    assert runner.stats["replay"] == 2


def test_tbo_children_get_their_own_wrappers():
    """TBO around flashinfer: each child's planner binds a wrapper to that child's buffers."""
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=6, device=dev)
    cb = compile_backend("tbo_flashinfer", CompileOptions(max_bs=16, capture_sizes=(16,), max_context_len=L))
    be = cb.instantiate(pool, device=dev)
    g = torch.Generator().manual_seed(2)
    k = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    FlashInferDecodeAdapter(be, 8, 2, 128)
    runner = GraphRunner(be, DecodeModel(k.bfloat16(), v.bfloat16(), 16, L, q_heads=8), (16,), dev)
    runner.capture()
    fb = make_batch(13, L, ROWS, seed=3, device=dev)
    q = torch.randn(13, 8, 128, generator=g).to(dev)
    runner.run(fb, q.bfloat16())
    m = be.forward_metadata
    qp = torch.zeros(16, 8, 128, device=dev)
    qp[:13] = q
    want = attention_from_pool(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), pool, fb.req_pool_indices,
                               fb.seq_lens_cpu)
    assert m.tbo0_plan is not m.plan and m.tbo1_plan is not m.tbo0_plan
    for child, lo, hi in ((m.tbo0_plan, 0, 8), (m.tbo1_plan, 8, 13)):
        out = torch.empty(8, 8, 128, dtype=torch.bfloat16, device=dev)
        child.run(qp[lo : lo + 8].bfloat16(), (k.bfloat16().view(-1, 1, 2, 128), v.bfloat16().view(-1, 1, 2, 128)),
                  out=out)
        rel = (out[: hi - lo].float().cpu() - want[lo:hi]).norm() / want[lo:hi].norm()
        assert rel < 1e-2, (lo, float(rel))
