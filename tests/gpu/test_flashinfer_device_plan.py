"""The split-KV partition attnmeta plans on the GPU, step by step, against FlashInfer's own plan()
of the same step on the same wrapper: every word its kernels read (work items up to the live count,
indptrs, chunk size, live mask). Long contexts (to 32k) and batch sizes 1 to 256, both decode
kernels and target verify, so the chunk search runs both under and at its CTA bound."""

import importlib.util
import random

import pytest
import torch

from attnmeta.backends.flashinfer.device_plan import live_regions
from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer not installed")]
L, ROWS, D, SIZES, H, HKV, HD = 32768, 300, 4, (1, 8, 64, 256), 32, 8, 128


@pytest.mark.parametrize("kind", ["cuda-cores", "tensor-cores", "verify"])
def test_device_partition_equals_flashinfer_plan_each_step(kind):
    dev = torch.device("cuda")
    mode = ForwardMode.TARGET_VERIFY if kind == "verify" else ForwardMode.DECODE
    cb = compile_backend("flashinfer", CompileOptions(max_bs=max(SIZES), capture_sizes=SIZES, max_context_len=L,
                                                      modes=(mode.name.lower(),), num_draft_tokens=D))
    req_to_token = torch.arange(ROWS * L, dtype=torch.int32, device=dev).view(ROWS, L)
    be = cb.instantiate(req_to_token, device=dev)
    # verify at bs 256 and 32k: FlashInfer's split-KV scratch for 1024 query rows outgrows the default
    adapter = FlashInferDecodeAdapter(be, H, HKV, HD, use_tensor_cores=kind != "cuda-cores", workspace_bytes=1 << 30)
    rng = random.Random(7)
    for step in range(16):
        bs = SIZES[step % len(SIZES)]
        hi = L - D
        lens = [rng.choice([1, 127, 128, 129, 4096, hi]) if rng.random() < 0.4
                else rng.randint(1, rng.choice([300, hi])) for _ in range(bs)]
        seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rng.sample(range(1, ROWS), bs))
        fb = ForwardBatch(mode, bs, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                          seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        be.init_forward_metadata_out_graph(fb)
        be.init_forward_metadata_in_graph(fb)  # the metadata graph, then the device planner after it
        m = be.forward_metadata
        w = m.plan
        state = adapter.site_of(w).state
        planner = state.device
        assert planner is not None, "the adapter fell back to FlashInfer's host planner"
        torch.cuda.synchronize()
        mine = w._int_workspace_buffer.clone()
        ones = torch.ones(bs, dtype=torch.int32)
        if mode is ForwardMode.DECODE:  # FlashInfer's own plan of this step, on the same wrapper
            w.plan(m.kv_indptr_host, state.empty, ones, H, HKV, HD, 1, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)
        else:
            qo = torch.arange(0, D * bs + 1, D, dtype=torch.int32)
            w.plan(qo, m.kv_indptr_host, state.empty, ones, H, HKV, HD, 1,
                   packed_custom_mask=w._custom_mask_buf, causal=False, q_data_type=torch.bfloat16,
                   kv_data_type=torch.bfloat16)
        torch.cuda.synchronize()
        want = w._int_workspace_buffer
        for at, n in live_regions(planner.layout, want):
            assert torch.equal(mine[at : at + n], want[at : at + n]), (kind, step, bs, at, n)


@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tensor-cores", "cuda-cores"])
def test_long_context_attention_through_the_device_planner(tensor_cores):
    """Captured and replayed to 32k tokens, the partition planned in the graph: FlashInfer attention
    within 1e-2 of the fp32 oracle read from the pool, with sequences long enough that the chunk
    search splits them into many KV chunks next to one-token ones."""
    from attnmeta.sim import DecodeModel, GraphRunner
    from attnmeta.sim.attention import attention_from_pool
    from tests.batches import make_pool

    dev, rows, sizes = torch.device("cuda"), 10, (1, 8)
    pool = make_pool(rows, L, seed=9, device=dev)
    be = compile_backend("flashinfer", CompileOptions(max_bs=8, capture_sizes=sizes, max_context_len=L)).instantiate(
        pool, device=dev)
    g, gd = torch.Generator().manual_seed(4), torch.Generator(device=dev).manual_seed(4)
    k = torch.randn(rows * L + 1, 2, 128, generator=gd, device=dev, dtype=torch.bfloat16)  # drawn on the GPU
    v = torch.randn(rows * L + 1, 2, 128, generator=gd, device=dev, dtype=torch.bfloat16)
    adapter = FlashInferDecodeAdapter(be, 8, 2, 128, use_tensor_cores=tensor_cores)
    runner = GraphRunner(be, DecodeModel(k, v, 8, L, q_heads=8), sizes, dev)
    runner.capture()
    for step, lens in enumerate([[L], [L, 1, 17000, L - 1, 4096, 2, 30000], [1], [129, L, 5, 20000, 128]]):
        seq = torch.tensor(lens, dtype=torch.int32)
        rpi = torch.arange(1, len(lens) + 1)
        fb = ForwardBatch(ForwardMode.DECODE, len(lens), req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi,
                          seq_lens=seq.to(dev), seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        q = torch.randn(len(lens), 8, 128, generator=g)
        out = runner.run(fb, q.to(dev).bfloat16())
        torch.cuda.synchronize()
        want = attention_from_pool(q.to(dev).float(), k, v, pool, rpi, seq)
        rel = (out.float().cpu() - want).norm() / want.norm()
        assert rel < 1e-2, (step, float(rel))
    assert runner.stats["replay"] == 4
    assert all(s.state.device is not None for s in adapter.sites)
