"""``attnmeta demo``: compile the default backend, then drive a serving loop
through the GraphRunner and check every step against the eager twin."""

from __future__ import annotations

import time

import attrs
import torch

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.runtime import DecodeModel, GraphRunner, decode_attention_loop
from attnmeta.runtime.serving import ServingSim

from .eager import get_eager


@attrs.define
class DemoResult:
    backend: str
    device: str
    steps: int = 0
    idle_steps: int = 0
    padded: int = 0
    replays: int = 0
    eager: int = 0
    mismatches: int = 0
    max_abs_diff: float = 0.0
    captured: tuple = ()
    compile_s: float = 0.0
    loop_s: float = 0.0
    failures: list = attrs.Factory(list)


def compare_metadata(meta, ref, raw: int) -> list[str]:
    """Field-by-field, bit-exact, over the live rows only."""
    bad = []
    if not torch.equal(meta.kv_indptr[: raw + 1].cpu(), ref.kv_indptr.cpu()):
        bad.append("kv_indptr")
    n = int(ref.kv_indptr[-1]) if raw else 0
    if not torch.equal(meta.kv_indices[:n].cpu(), ref.kv_indices.cpu()):
        bad.append("kv_indices")
    if not torch.equal(meta.kv_last_page_len[:raw].cpu(), ref.kv_last_page_len.cpu()):
        bad.append("kv_last_page_len")
    if not torch.equal(meta.kv_indptr_host[: raw + 1], ref.kv_indptr_host):
        bad.append("kv_indptr_host")
    return bad


def run_demo(backend: str = "flashinfer", steps: int = 120, max_bs: int = 48, max_context_len: int = 256,
             capture_sizes=(1, 2, 4, 8, 16, 24, 32), device: str | None = None, seed: int = 0) -> DemoResult:
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    capture_sizes = tuple(s for s in capture_sizes if s <= max_bs) or (max_bs,)
    res = DemoResult(backend, str(dev), captured=tuple(capture_sizes))
    t0 = time.perf_counter()
    compiled = compile_backend(backend, CompileOptions(max_bs=max_bs, capture_sizes=capture_sizes,
                                                       max_context_len=max_context_len))
    res.compile_s = time.perf_counter() - t0
    sim = ServingSim(max_reqs=max_bs, max_context_len=max_context_len, num_slots=max_bs * max_context_len + 1,
                     device=dev, seed=seed, max_batch=max_bs)
    be = compiled.instantiate(sim.req_to_token, device=dev)
    model = DecodeModel(sim.k_cache, sim.v_cache, max_bs, max_context_len)
    runner = GraphRunner(be, model, capture_sizes, dev)
    runner.capture()
    eager = get_eager(backend)(sim.req_to_token, max_bs)
    t1 = time.perf_counter()
    for step in range(steps):
        fb, q = sim.step()
        out = runner.run(fb, q)
        res.steps += 1
        if fb.forward_mode.is_idle():
            res.idle_steps += 1
            continue
        ref = eager.init_forward_metadata(fb)
        bad = compare_metadata(be.forward_metadata, ref, fb.batch_size)
        if bad:
            res.mismatches += 1
            res.failures.append((step, fb.batch_size, bad))
        want = decode_attention_loop(q.cpu(), sim.k_cache.cpu(), sim.v_cache.cpu(), ref.kv_indptr.cpu(),
                                     ref.kv_indices.cpu())
        res.max_abs_diff = max(res.max_abs_diff, float((out.cpu() - want).abs().max()))
    res.loop_s = time.perf_counter() - t1
    res.replays, res.eager = runner.stats["replay"], runner.stats["eager"]
    res.padded = runner.stats["padded_rows"]
    return res


def format_result(r: DemoResult) -> str:
    rows = [
        ("backend", r.backend), ("device", r.device), ("compile (s)", f"{r.compile_s:.2f}"),
        ("captured sizes", " ".join(map(str, r.captured))), ("steps run", r.steps), ("  idle steps", r.idle_steps),
        ("graph replays", r.replays), ("  padded rows", r.padded), ("eager fallbacks", r.eager),
        ("metadata mismatches", r.mismatches),
        ("max |attn - eager| (fp32)", f"{r.max_abs_diff:.2e}"), ("loop (s)", f"{r.loop_s:.1f}"),
    ]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)
