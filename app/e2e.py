"""``attnmeta bench --e2e-layers N``: a model-shaped decode loop, per-step wall time (GPU only).

Each step prepares the metadata, then replays one CUDA graph holding N layers of real decode
attention over one KV pool (32 query / 8 KV heads of 128, bf16): FlashInfer's planned decode
wrapper for ``flashinfer``, the split-KV Triton kernel for ``triton``, FlashInfer's XQA kernel (no
planner) over the page table for ``flashattention`` (``--page-size`` 16 or more). The step ends with a
device synchronize, so its time is what the GPU and host spend together. Side by side:

- attention: the attention graph alone (no metadata work): what a step cannot go below;
- attnmeta: the compiled backend's out_graph (staging, planner) + one graph with the recorded
  metadata kernel and the N layers;
- baseline: how engines prepare metadata today: the eager twin (host work and small kernels),
  its results copied into the static buffers the captured attention reads, the planner where
  the backend has one (FlashInfer's real plan()), then the attention graph;

and the share of the step each path spends outside attention.
"""

from __future__ import annotations

import statistics
import time

import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, OptionsError, compile_backend
from attnmeta.runtime import ForwardMode, ReplayView
from attnmeta.sim import DecodeModel

from .bench import HEADS, _batches

FIELDS = ("kv_indptr", "kv_indices", "num_kv_splits", "page_table", "cache_seqlens_int32")


def _wall(step, iters: int, warmup: int, setup=None) -> float:
    """Median wall µs of ``step(i)`` + synchronize; ``setup(i)``, untimed, runs before each step."""
    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    ts = []
    for i in range(iters):
        if setup is not None:
            setup(i)
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def _graph(fn):
    fn()  # warm-up: kernel compiles and JIT outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def check_e2e(backend: str, page_size: int) -> None:
    """Refuses what run_e2e cannot measure, naming why (called by the command line before any work)."""
    if backend not in ("flashinfer", "triton") and not (backend == "flashattention" and page_size >= 16):
        raise OptionsError(f"--e2e-layers runs FlashInfer's wrapper, FlashInfer's XQA (flashattention with "
                           f"--page-size 16 or more) or the Triton split-KV kernel; {backend!r} with page size "
                           f"{page_size} has no real attention kernel here")
    if not torch.cuda.is_available():
        raise OptionsError("--e2e-layers runs real attention kernels: it needs a CUDA device")


def run_e2e(backend: str, sizes=(1, 8, 64, 256), layers: int = 32, iters: int = 100, warmup: int = 10,
            max_context_len: int = 4096, progress=lambda xs, *a, **k: xs, page_size: int = 1) -> list[dict]:
    check_e2e(backend, page_size)
    xqa = backend == "flashattention"
    dev, L, max_bs, P = torch.device("cuda"), max_context_len, max(sizes), page_size if xqa else 1
    compiled = compile_backend(backend, CompileOptions(max_bs=max_bs, capture_sizes=sizes, max_context_len=L,
                                                       num_heads=HEADS[0], num_kv_heads=HEADS[1], page_size=P))
    rows = max_bs + 1
    # the pool: each row whole pages of P slots (page 0 unused), as a paged allocator fills it
    pages = torch.randperm(rows * L // P).view(rows, L // P) + 1
    pool = (pages.repeat_interleave(P, dim=1) * P + torch.arange(L) % P).to(torch.int32).to(dev)
    pool[0] = 0
    g = torch.Generator().manual_seed(0)
    slots = (rows * L // P + 1) * P
    k = torch.randn(slots, HEADS[1], HEADS[2], generator=g).to(dev).bfloat16()
    v = torch.randn(slots, HEADS[1], HEADS[2], generator=g).to(dev).bfloat16()
    eager = get_eager(backend)(pool, max_bs, page_size=P) if xqa else get_eager(backend)(pool, max_bs)
    world = (backend, compiled, pool, k, v, eager, g, layers, iters, warmup)
    return [_one_size(bs, world) for bs in progress(sizes, f"e2e {backend}", unit="size")]


def _one_size(bs: int, world) -> dict:
    backend, compiled, pool, k, v, eager, g, layers, iters, warmup = world
    dev, rows, L = pool.device, pool.shape[0], pool.shape[1]
    be = compiled.instantiate(pool, device=dev)
    if backend == "flashinfer":
        from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter

        FlashInferDecodeAdapter(be, *HEADS)
    xqa = None
    if backend == "flashattention":
        from attnmeta.sim.flashinfer_attention import XQADecode

        xqa = XQADecode(dev)
    model = DecodeModel(k, v, compiled.options.max_bs, L, page_size=compiled.options.page_size, q_heads=HEADS[0],
                        xqa=xqa)
    model.prepare(torch.randn(bs, HEADS[0], HEADS[2], generator=g).to(dev).bfloat16(), bs)
    batches = _batches(8, bs, L, rows, dev, seed=bs)
    cap = _batches(1, bs, 64, rows, dev, seed=99)[0]
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    meta = be.forward_metadata

    def layers_fn():
        for _ in range(layers):
            model.forward(meta, bs)

    def full_fn():
        be.init_forward_metadata_in_graph(cap)
        layers_fn()

    g_full, g_attn = _graph(full_fn), _graph(layers_fn)

    def attnmeta_step(i):
        be.init_forward_metadata_out_graph(ReplayView.of(batches[i % 8], bs))
        g_full.replay()

    def baseline_step(i):
        fb = batches[i % 8]
        m = eager.init_forward_metadata(fb)
        for f in FIELDS:  # into the static buffers the captured attention reads
            src = getattr(m, f, None)
            if src is None:
                continue
            dst = getattr(meta, f)
            if src.dim() == 2:  # a page table at the batch's own width
                dst[: src.shape[0], : src.shape[1]].copy_(src, non_blocking=True)
            else:
                dst[: src.numel()].copy_(src, non_blocking=True)
        if backend == "flashinfer":
            be.bound(ForwardMode.DECODE, bs).calls["plan"](m.kv_indptr_host, torch.ones(bs, dtype=torch.int32))
        g_attn.replay()

    # attention alone over each step's real metadata (staged untimed): the capture batch's short
    # sequences would understate it
    t = {"attention": _wall(lambda i: g_attn.replay(), iters, warmup, setup=attnmeta_step),
         "attnmeta": _wall(attnmeta_step, iters, warmup), "baseline": _wall(baseline_step, iters, warmup)}
    return {"bs": bs, "layers": layers, **{f"{n}_us": round(x, 1) for n, x in t.items()},
            "attnmeta_meta_share": round(1 - t["attention"] / t["attnmeta"], 3),
            "baseline_meta_share": round(1 - t["attention"] / t["baseline"], 3),
            "baseline/attnmeta": round(t["baseline"] / t["attnmeta"], 2)}


def format_e2e(rows: list[dict], device: str, backend: str) -> str:
    from .table import table

    cols = ["bs", "layers", "attention_us", "attnmeta_us", "baseline_us", "baseline/attnmeta", "attnmeta_meta_share",
            "baseline_meta_share"]
    return table(rows, cols, markdown=True, title=f"{backend}: decode step wall time on {device} (median µs, "
                 "synchronized), N layers of real attention; *_meta_share: the step's share outside attention")
