"""FlashInfer graph-mode decode wrappers on the compiled backend's static
buffers: captured and replayed against the fp32 pool oracle (bf16)."""

import importlib.util

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import DecodeModel, ForwardBatch, GraphRunner
from attnmeta.runtime.attention import attention_from_pool
from attnmeta.runtime.flashinfer_adapter import FlashInferDecodeAdapter
from tests.batches import make_batch, make_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, MAX_BS, SIZES = 1024, 80, 64, (1, 8, 16, 64)


def test_flashinfer_replay_matches_the_oracle():
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=4, device=dev)
    cb = compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L))
    be = cb.instantiate(pool, device=dev)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 2, 128, generator=g).to(dev)
    FlashInferDecodeAdapter(be, 8, 2, 128)
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
