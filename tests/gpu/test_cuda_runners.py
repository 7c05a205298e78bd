"""The breakable graph and the EAGLE draft runner with real CUDA graphs."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.sim import DraftModel, DraftRunner
from attnmeta.sim.attention import attention_from_pool, draft_attention_from_pool
from attnmeta.sim.runners import BreakableGraph
from tests.batches import make_batch, make_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS = 256, 20


def test_breakable_graph_on_cuda():
    dev = torch.device("cuda")
    x, mid, out = (torch.zeros(4, device=dev) for _ in range(3))
    seen = []

    def eager():
        seen.append(float(mid.sum().item()))  # a sync: fine in an eager region
        mid.mul_(2)

    bg = BreakableGraph([("a", lambda: mid.copy_(x + 1)), ("b", eager), ("c", lambda: out.copy_(mid * 3))],
                        {"b"}, dev)
    bg.capture()
    x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0], device=dev))
    bg.replay()
    torch.cuda.synchronize()
    assert out.tolist() == [12.0, 18.0, 24.0, 30.0] and seen[-1] == 14.0


def test_draft_runner_on_cuda():
    dev, S = torch.device("cuda"), 3
    cb = compile_backend("multistep_triton", CompileOptions(max_bs=16, capture_sizes=(4, 16), max_context_len=L,
                                                           num_steps=S))
    pool = make_pool(ROWS, L, seed=2, device=dev)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 16, generator=g).to(dev), torch.randn(ROWS * L + 1, 2, 16, generator=g).to(dev)
    runner = DraftRunner(cb.instantiate(pool, device=dev), DraftModel(k, v, 16, L, S), (4, 16), dev)
    runner.capture()
    for seed, raw in [(3, 16), (4, 3)]:
        fb = make_batch(raw, L, ROWS, seed=seed, max_len=L - S, device=dev)
        q = torch.randn(raw, 2, 16, generator=g).to(dev)
        out = runner.run(fb, q)
        torch.cuda.synchronize()
        want = sum(attention_from_pool(q, k, v, pool, fb.req_pool_indices, fb.seq_lens_cpu + s + 1) for s in range(S))
        torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)


def test_draft_runner_with_branches_on_cuda():
    dev, S, K = torch.device("cuda"), 3, 4
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=16, capture_sizes=(4, 16), max_context_len=L,
                                                               num_steps=S, topk=K))
    pool = make_pool(ROWS, L, seed=2, device=dev)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 16, generator=g).to(dev), torch.randn(ROWS * L + 1, 2, 16, generator=g).to(dev)
    runner = DraftRunner(cb.instantiate(pool, device=dev), DraftModel(k, v, 16, L, S, topk=K), (4, 16), dev)
    runner.capture()
    for seed, raw in [(3, 16), (4, 3)]:
        fb = make_batch(raw, L, ROWS, seed=seed, max_len=L - K * S, device=dev)
        q = torch.randn(raw, K, 2, 16, generator=g).to(dev)
        out = runner.run(fb, q)
        torch.cuda.synchronize()
        want = draft_attention_from_pool(q, k, v, pool.cpu(), fb.req_pool_indices.cpu(), fb.seq_lens_cpu, S, K)
        torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)


def test_piecewise_runner_on_cuda():
    from attnmeta.compiler import ForwardMode
    from attnmeta.sim.runners import PiecewiseRunner

    dev = torch.device("cuda")
    cb = compile_backend("flashinfer", CompileOptions(max_bs=8, capture_sizes=(8,), max_context_len=L,
                                                     modes=("extend",)))
    be = cb.instantiate(make_pool(ROWS, L, seed=1, device=dev), device=dev)
    x, h, out = (torch.zeros(64, 4, device=dev) for _ in range(3))
    seen = []

    def attention(fb, n):  # eager: may read host values and run any shape
        seen.append(int(be.forward_metadata.qo_indptr[-1]))
        h[:n] *= 2

    runner = PiecewiseRunner(be, lambda n: h[:n].copy_(x[:n] + 1), attention, lambda n: out[:n].copy_(h[:n] * 3),
                             (16, 64), dev)
    runner.capture()
    fb = make_batch(3, L, ROWS, seed=2, mode=ForwardMode.EXTEND, device=dev)
    fb.extend_seq_lens_cpu = torch.tensor([2, 3, 4], dtype=torch.int32)
    fb.extend_seq_lens = fb.extend_seq_lens_cpu.to(dev)
    fb.extend_prefix_lens_cpu = (fb.seq_lens_cpu - fb.extend_seq_lens_cpu).clamp(min=0)
    fb.extend_prefix_lens = fb.extend_prefix_lens_cpu.to(dev)
    x[:9] = torch.arange(36, dtype=torch.float32, device=dev).view(9, 4)
    assert runner.run(fb, 9) == 16
    torch.cuda.synchronize()
    assert seen[-1] == 9
    torch.testing.assert_close(out[:9], (x[:9] + 1) * 6)
