"""Real FlashInfer on a sliding-window layer under EAGLE (topk 1): the window layers' prefill wrapper of target
verify (the last min(seq, W) cached slots, then the D drafts) and of draft extend (the last min(seq, W + T) slots,
the T queries last), planned by the adapter (FlashInfer's ``window_left`` W, causal, no mask), captured in CUDA
graphs with the attention run as SGLang runs a window layer (``forward(causal=True, window_left=W)``) and replayed
with new batches, against fp32 attention over each request's whole row in which a query at position p sees the
keys p - W .. p (tests/oracles.py). A window cut one key off either way, or a draft seeing the prefix past its own
window, fails it."""

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
L, ROWS, D, MAX_BS, SIZES, H, HKV, HD, W = 1024, 40, 4, 16, (4, 16), 8, 2, 128, 100


def batch(mode, lens, rows, dev):
    seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
    return ForwardBatch(mode, len(lens), req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi,
                        seq_lens=seq.to(dev), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()),
                        out_cache_loc=torch.zeros(len(lens) * D, dtype=torch.int64, device=dev))


@pytest.mark.parametrize("planner", ["host", "plan_on_device"])
@pytest.mark.parametrize("mode", [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND], ids=["verify", "draft"])
def test_window_wrapper_attends_each_query_to_its_window(mode, planner):
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=4, device=dev)
    cb = compile_backend("flashinfer", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, modes=(mode.name.lower(),), num_draft_tokens=D,
        sliding_window=W, backend=FlashInferOptions(plan_on_device=planner == "plan_on_device")))
    be = cb.instantiate(pool, device=dev)
    FlashInferDecodeAdapter(be, H, HKV, HD, partition="host" if planner == "host" else "device")
    k, v, kv = token_kv_cache(ROWS * L + 1, HKV, HD, 5, dev)
    g = torch.Generator().manual_seed(5 + 100)  # the queries' and masks' draws
    qbuf = torch.zeros(MAX_BS * D, H, HD, dtype=torch.bfloat16, device=dev)
    obuf = torch.zeros_like(qbuf)

    def attend(w, bs):  # as SGLang's forward_extend runs a window layer's paged wrapper
        obuf[: bs * D] = w.forward(qbuf[: bs * D], kv, causal=True, window_left=W)

    graphs = {}
    for bs in sorted(SIZES, reverse=True):
        fb = batch(mode, [D + 1] * bs, [0] * bs, dev)
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        w = be.forward_metadata.plan_window
        be.init_forward_metadata_in_graph(fb)
        attend(w, bs)
        torch.cuda.synchronize()
        graphs[bs] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bs]):
            be.init_forward_metadata_in_graph(fb)
            attend(w, bs)
    rng = random.Random(2)
    for step in range(10):
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= raw)
        lens = [rng.choice([D, D + 1, W - 1, W, W + 1, W + D, 2 * W, L - D]) if rng.random() < 0.5
                else rng.randint(D, L - D) for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        be.init_forward_metadata_out_graph(ReplayView.of(batch(mode, lens, rows, dev), bs))
        q = torch.randn(raw * D, H, HD, generator=g).to(dev).bfloat16()
        qbuf[: raw * D] = q
        qbuf[raw * D: bs * D] = 0
        graphs[bs].replay()
        torch.cuda.synchronize()
        # verify: the D drafts follow the seq cached keys; draft extend: seq counts its D query slots
        want = masked_attention_from_pool(q, k, v, pool, rows, lens, D, D if mode.is_target_verify() else 0,
                                          window=W)
        got = obuf[: raw * D].float()
        rel = float((got - want).norm() / want.norm())
        assert rel < 1e-2, (step, raw, bs, rel)
        # a request longer than its window would read far other values without it: the window is in force
        full = masked_attention_from_pool(q, k, v, pool, rows, lens, D, D if mode.is_target_verify() else 0)
        for i in (i for i, n in enumerate(lens) if n > 2 * W):
            a, b = got[i * D: (i + 1) * D], full[i * D: (i + 1) * D]
            assert float((a - b).norm() / b.norm()) > 0.1, (step, i, lens[i], "no window applied")


def tree_masks(lens: list[int], g: random.Random) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per request a random draft tree (each draft's parent an earlier draft, draft 0 the root): the mask EAGLE
    writes (D rows of seq + D, every cached key and the draft's ancestors and itself) and, for the oracle, the
    same rows with each draft's window applied: a draft at depth d (its position seq + d) sees the cached keys from
    seq + d - W on."""
    plain, windowed = [], []
    for s in lens:
        parents = [-1] + [g.randrange(c) for c in range(1, D)]
        m = torch.zeros(D, s + D, dtype=torch.bool)
        m[:, :s] = True
        w = m.clone()
        for c in range(D):
            chain, p = [], c
            while p >= 0:
                chain.append(p)
                p = parents[p]
            m[c, [s + x for x in chain]] = True
            w[c, [s + x for x in chain]] = True
            w[c, : max(s + len(chain) - 1 - W, 0)] = False
        plain.append(m.flatten())
        windowed.append(w.flatten())
    return plain, windowed


def test_tree_verify_window_wrapper_attends_each_draft_to_its_window():
    """EAGLE topk > 1: the window wrapper's one item per draft query (its last min(seq, W) cached keys and the
    drafts its tree-mask row shows), planned on the GPU, captured and replayed with SGLang's forward of a window
    layer, against fp32 attention under the tree mask with each draft's own window (by its depth, from the tree)."""
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=6, device=dev)
    cb = compile_backend("flashinfer", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, modes=("target_verify",), num_draft_tokens=D,
        topk=2, num_steps=3, sliding_window=W, backend=FlashInferOptions(plan_on_device=True)))
    be = cb.instantiate(pool, device=dev)
    FlashInferDecodeAdapter(be, H, HKV, HD, partition="device")
    k, v, kv = token_kv_cache(ROWS * L + 1, HKV, HD, 7, dev)
    g, rng = torch.Generator().manual_seed(8), random.Random(3)
    qbuf = torch.zeros(MAX_BS * D, H, HD, dtype=torch.bfloat16, device=dev)
    obuf = torch.zeros_like(qbuf)
    mode = ForwardMode.TARGET_VERIFY
    graphs, windows = {}, {}
    for bs in sorted(SIZES, reverse=True):
        fb = batch(mode, [D + 1] * bs, [0] * bs, dev)
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        windows[bs] = w = be.forward_metadata.plan_window
        be.init_forward_metadata_in_graph(fb)
        obuf[: bs * D] = w.forward(qbuf[: bs * D], kv, causal=True, window_left=W)
        torch.cuda.synchronize()
        graphs[bs] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bs]):
            be.init_forward_metadata_in_graph(fb)
            obuf[: bs * D] = w.forward(qbuf[: bs * D], kv, causal=True, window_left=W)
    for step in range(10):
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= raw)
        lens = [rng.choice([1, D, W - 1, W, W + 1, W + D, 2 * W, L - D]) if rng.random() < 0.5
                else rng.randint(1, L - D) for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        plain, windowed = tree_masks(lens, rng)
        mask = torch.cat(plain)
        be.bound(mode, bs).field("custom_mask")[: mask.numel()].copy_(mask.to(dev))  # the drafter writes it
        be.init_forward_metadata_out_graph(ReplayView.of(batch(mode, lens, rows, dev), bs))
        q = torch.randn(raw * D, H, HD, generator=g).to(dev).bfloat16()
        qbuf[: raw * D] = q
        qbuf[raw * D: bs * D] = 0
        graphs[bs].replay()
        torch.cuda.synchronize()
        want = masked_attention_from_pool(q, k, v, pool, rows, lens, D, D, masks=[x.to(dev) for x in windowed])
        got = obuf[: raw * D].float()
        rel = float((got - want).norm() / want.norm())
        assert rel < 1e-2, (step, raw, bs, rel)
        # the window is in force: under the tree mask alone a request longer than it reads far other values
        full = masked_attention_from_pool(q, k, v, pool, rows, lens, D, D, masks=[x.to(dev) for x in plain])
        for i in (i for i, n in enumerate(lens) if n > 2 * W):
            a, b = got[i * D: (i + 1) * D], full[i * D: (i + 1) * D]
            assert float((a - b).norm() / b.norm()) > 0.1, (step, i, lens[i], "no window applied")
        assert windows[bs]._window_left == W
