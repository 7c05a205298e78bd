"""The breakable graph, the piecewise EXTEND runner and the EAGLE draft runner
on the emulated graph: replays equal eager runs, eager regions see the real
batch, captured pieces reject host syncs."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import CaptureSyncError, ForwardBatch
from attnmeta.sim import DraftModel, DraftRunner
from attnmeta.sim.attention import attention_from_pool, draft_attention_from_pool
from attnmeta.sim.runners import BreakableGraph, PiecewiseRunner
from tests.batches import make_batch, make_pool

L, ROWS = 48, 12


def test_breakable_graph_replays_pieces_and_runs_eager_regions():
    x, mid, out = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    seen = []

    def eager():  # may sync: it is not recorded
        seen.append(int(mid.sum().item()))
        mid.mul_(2)

    bg = BreakableGraph([("a", lambda: mid.copy_(x + 1)), ("b", eager), ("c", lambda: out.copy_(mid * 3))],
                        {"b"}, "cpu")
    bg.capture()
    x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    bg.replay()
    assert out.tolist() == [12.0, 18.0, 24.0, 30.0] and seen[-1] == 14
    with pytest.raises(CaptureSyncError):
        BreakableGraph([("a", lambda: mid.sum().item())], set(), "cpu").capture()
    with pytest.raises(ValueError, match=r"eager regions \['z'\] name no segment"):
        BreakableGraph([("a", eager)], {"z"}, "cpu")


def test_piecewise_extend_runs_attention_on_the_real_batch():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=8, capture_sizes=(8,), max_context_len=L,
                                                     modes=("extend",)))
    pool = make_pool(ROWS, L, seed=1)
    be = cb.instantiate(pool)
    x, h, out = torch.zeros(64, 4), torch.zeros(64, 4), torch.zeros(64, 4)
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    seen = []

    def attention(fb, n):  # per request: mean of its new tokens' hidden rows, through qo_indptr
        ind = be.forward_metadata.qo_indptr.tolist()
        seen.append((fb.batch_size, ind[-1]))
        for i in range(fb.batch_size):
            h[ind[i] : ind[i + 1]] = h[ind[i] : ind[i + 1]].mean(0, keepdim=True)

    runner = PiecewiseRunner(be, lambda n: h[:n].copy_(x[:n] @ w), attention, lambda n: out[:n].copy_(h[:n].relu()),
                             token_sizes=(16, 32, 64), device="cpu")
    runner.capture()
    for seed, bs in [(1, 3), (2, 5)]:
        fb = make_batch(bs, L, ROWS, seed=seed, mode=ForwardMode.EXTEND)
        ext = torch.randint(1, 6, (bs,), dtype=torch.int32, generator=torch.Generator().manual_seed(seed))
        fb.extend_seq_lens, fb.extend_seq_lens_cpu = ext, ext.clone()
        fb.extend_prefix_lens_cpu = (fb.seq_lens_cpu - ext).clamp(min=0)
        fb.extend_prefix_lens = fb.extend_prefix_lens_cpu.clone()
        n_tok = int(ext.sum())
        x[:n_tok] = torch.randn(n_tok, 4)
        bucket = runner.run(fb, n_tok)
        want = x[:n_tok] @ w
        ind = [0, *torch.cumsum(ext, 0).tolist()]
        for i in range(bs):
            want[ind[i] : ind[i + 1]] = want[ind[i] : ind[i + 1]].mean(0, keepdim=True)
        assert bucket >= n_tok and seen[-1] == (bs, n_tok)  # the eager region saw the real batch
        torch.testing.assert_close(out[:n_tok], want.relu())
    with pytest.raises(ValueError, match="exceed the largest captured bucket 64"):
        runner.run(fb, 65)


def test_draft_runner_runs_every_step_on_its_own_metadata():
    S = 3
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=8, capture_sizes=(4, 8), max_context_len=L,
                                                               num_steps=S))
    pool = make_pool(ROWS, L, seed=2)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 8, generator=g), torch.randn(ROWS * L + 1, 2, 8, generator=g)
    runner = DraftRunner(cb.instantiate(pool), DraftModel(k, v, 8, L, S), (4, 8), "cpu")
    runner.capture()
    for seed, raw in [(3, 8), (4, 3), (5, 0)]:
        fb = make_batch(raw, L, ROWS, seed=seed, max_len=L - S) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        q = torch.randn(raw, 2, 8, generator=g)
        out = runner.run(fb, q)
        if raw:
            want = sum(attention_from_pool(q, k, v, pool, fb.req_pool_indices, fb.seq_lens_cpu + s + 1)
                       for s in range(S))
            torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
    assert runner.stats["replay"] == 3


def test_draft_runner_with_branches():
    """topk 2: each request's two branches attend to the prefix plus their own drafted tokens."""
    S, K = 3, 2
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=8, capture_sizes=(4, 8), max_context_len=L,
                                                               num_steps=S, topk=K))
    pool = make_pool(ROWS, L, seed=2)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 8, generator=g), torch.randn(ROWS * L + 1, 2, 8, generator=g)
    runner = DraftRunner(cb.instantiate(pool), DraftModel(k, v, 8, L, S, topk=K), (4, 8), "cpu")
    runner.capture()
    for seed, raw in [(3, 8), (4, 3)]:
        fb = make_batch(raw, L, ROWS, seed=seed, max_len=L - K * S)
        q = torch.randn(raw, K, 2, 8, generator=g)
        out = runner.run(fb, q)
        want = draft_attention_from_pool(q, k, v, pool, fb.req_pool_indices, fb.seq_lens_cpu, S, K)
        torch.testing.assert_close(out, want, rtol=0, atol=1e-5)


def test_pool_oracle_widens_grouped_kv_heads_per_request():
    """A pool of fewer KV heads than queries (grouped-query attention): query head h reads KV head
    h // (H / HKV), and a bf16 pool is read in the query's dtype. Hand case: 2 KV heads, 4 query heads,
    every query zero (so attention is the plain mean of the values it reads)."""
    pool = torch.tensor([[0, 0, 0], [1, 2, 3]], dtype=torch.int32)
    v = torch.zeros(4, 2, 1, dtype=torch.bfloat16)
    v[1:, 0, 0] = torch.tensor([1.0, 2.0, 3.0])  # KV head 0 holds 1, 2, 3 at slots 1..3
    v[1:, 1, 0] = torch.tensor([10.0, 20.0, 30.0])
    k = torch.randn(4, 2, 1).to(torch.bfloat16)
    q = torch.zeros(1, 4, 1)
    out = attention_from_pool(q, k, v, pool, torch.tensor([1]), torch.tensor([2]))  # slots 1, 2
    assert out.dtype == torch.float32
    assert out[0, :, 0].tolist() == [1.5, 1.5, 15.0, 15.0]
