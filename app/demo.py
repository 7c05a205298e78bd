"""``attnmeta demo``: compile the default backend, then drive a serving loop
through the GraphRunner and check every step against the eager twin. A
``multistep_*`` backend runs as an EAGLE drafter instead: the DraftRunner,
S draft steps and topk branches per request, with the pool handing out the
drafts' slots every step."""

from __future__ import annotations

import time

import attrs
import torch

from attnmeta.backends import get_eager
from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.compiler import CompileOptions, OptionsError, compile_backend, get_spec
from attnmeta.sim import DecodeModel, DraftModel, DraftRunner, GraphRunner
from attnmeta.sim.attention import (
    attention_from_pool,
    draft_attention_from_pool,
    dsv4_attention_from_pool,
    mla_attention_from_pool,
)
from attnmeta.sim.compare import compare_metadata, padded
from attnmeta.sim.models import DSV4Model, MLAModel
from attnmeta.sim.serving import ServingSim

MLA_ROPE = 8  # the demo's rope width (DeepSeek's is 64; its latent 512)


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


def run_demo(backend: str = "flashinfer", steps: int = 120, max_bs: int = 48, max_context_len: int = 256,
             capture_sizes=(1, 2, 4, 8, 16, 24, 32), device: str | None = None, seed: int = 0,
             num_steps: int = 3, topk: int = 1, progress=lambda xs, *a, **k: xs) -> DemoResult:
    """``progress`` wraps the step loop (the CLI passes a progress bar)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    capture_sizes = tuple(s for s in capture_sizes if s <= max_bs) or (max_bs,)
    res = DemoResult(backend, str(dev), captured=tuple(capture_sizes))
    draft = backend.startswith("multistep_") or backend == "flashattention_draft"
    dsv4 = backend.removeprefix("tbo_") == "dsv4"
    mla = backend.removeprefix("tbo_") == "flashinfer_mla"  # latent attention: the torch MLA reference
    if dsv4:
        max_context_len = max(max_context_len, 640)  # long enough for compressed blocks of 128 and pages of 256
    served = get_spec(backend).page_sizes
    if served and 1 not in served and not dsv4:
        raise OptionsError(f"the demo's serving simulation hands out token slots (pages of one token); {backend} "
                           f"serves pages of {list(served)} tokens: attnmeta compile {backend} --page-size "
                           f"{served[0]} compiles it; the test suite drives it (tests/runtime/test_engine_modes.py)")
    t0 = time.perf_counter()
    compiled = compile_backend(backend, CompileOptions(max_bs=max_bs, capture_sizes=capture_sizes,
                                                       max_context_len=max_context_len, num_steps=num_steps,
                                                       topk=topk))
    res.compile_s = time.perf_counter() - t0
    slots = max_bs * max_context_len + 1
    sim = ServingSim(max_reqs=max_bs, max_context_len=max_context_len, num_slots=slots,
                     device=dev, seed=seed, max_batch=max_bs, draft_slots=num_steps * topk if draft else 0)
    pools, extra = {}, {}
    if dsv4:  # the SWA copy of every slot, and one compressed entry per half page
        g = torch.Generator().manual_seed(seed + 1)
        pools["full_to_swa"] = swa_table(slots, "cpu").to(dev)
        extra = {name: torch.randn(2 * (slots // 256 + 1), *sim.k_cache.shape[1:], generator=g).to(dev)
                 for name in ("c128_k", "c128_v")}
    be = compiled.instantiate(sim.req_to_token, device=dev, pools=pools)
    if draft:
        model = DraftModel(sim.k_cache, sim.v_cache, max_bs, max_context_len, num_steps, topk)
        runner = DraftRunner(be, model, capture_sizes, dev)
        eager = get_eager(backend)(sim.req_to_token, max_bs, num_steps=num_steps, **(
            {"topk": topk} if backend.startswith("multistep_") else {}))
    elif mla:  # the pool's caches as one latent head: ckv of heads x head_dim, kpe the first rope dims
        ckv, kpe = sim.k_cache.reshape(slots, -1), sim.v_cache[:, 0, :MLA_ROPE].contiguous()
        runner = GraphRunner(be, MLAModel(ckv, kpe, max_bs, max_context_len, sim.k_cache.shape[1]), capture_sizes,
                             dev)
        eager = get_eager(backend)(sim.req_to_token, max_bs)
    elif dsv4:
        model = DSV4Model(sim.k_cache, sim.v_cache, extra["c128_k"], extra["c128_v"], max_bs, max_context_len)
        runner = GraphRunner(be, model, capture_sizes, dev)
        eager = get_eager(backend)(sim.req_to_token, max_bs, pools["full_to_swa"])
    else:
        runner = GraphRunner(be, DecodeModel(sim.k_cache, sim.v_cache, max_bs, max_context_len), capture_sizes, dev)
        eager = get_eager(backend)(sim.req_to_token, max_bs)  # page size 1: the demo's pool is token-granular
    runner.capture()
    t1 = time.perf_counter()
    for step in progress(range(steps), f"demo {backend}", unit="step"):
        fb, q = sim.step()
        if dsv4 and fb.batch_size:  # the slot the decoded token's KV is written to
            fb.out_cache_loc = sim.req_to_token[fb.req_pool_indices, fb.seq_lens.long() - 1].long()
        if draft and topk > 1:  # a query per branch
            q = q[:, None].expand(-1, topk, -1, -1) + torch.arange(topk, device=dev)[:, None, None]
        if mla:  # [bs, H, C + R]: a latent part as wide as ckv, then the rope part
            q = torch.cat([q.repeat(1, 1, q.shape[1]), q[..., :MLA_ROPE]], dim=-1)
        out = runner.run(fb, q)
        res.steps += 1
        if fb.forward_mode.is_idle():
            res.idle_steps += 1
            continue
        bs = runner.padded_size(fb.batch_size) or fb.batch_size  # eager past the largest size: unpadded
        full = padded(fb, bs)
        bad = compare_metadata(be.forward_metadata, eager.init_forward_metadata(full), full.seq_lens_cpu,
                               256 if dsv4 else 1)
        if bad:
            res.mismatches += 1
            res.failures.append((step, fb.batch_size, bad))
        if dsv4:
            want = dsv4_attention_from_pool(q, sim.k_cache, sim.v_cache, extra["c128_k"], extra["c128_v"],
                                            sim.req_to_token, pools["full_to_swa"], fb.req_pool_indices,
                                            fb.seq_lens_cpu)
        elif mla:
            want = mla_attention_from_pool(q, ckv, kpe, sim.req_to_token, fb.req_pool_indices, fb.seq_lens_cpu)
        elif draft:
            want = draft_attention_from_pool(q, sim.k_cache, sim.v_cache, sim.req_to_token.cpu(),
                                             fb.req_pool_indices.cpu(), fb.seq_lens_cpu, num_steps, topk)
        else:
            want = attention_from_pool(q, sim.k_cache, sim.v_cache, sim.req_to_token, fb.req_pool_indices,
                                       fb.seq_lens_cpu)
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
