"""``attnmeta bench``: host time per decode step, side by side in one run.

- floor: one packed host->device copy of the step's input bytes + replay of
  the captured metadata graph (what a GPU allows at least);
- compiled: the compiled backend's out_graph (staging, host ops, planner) +
  replay;
- eager: the hand-written eager twin building the same metadata;
- validate: the part of ``stage`` that checks the batch at the boundary
  (every live value against its range), timed alone;
- gpu: on a GPU, the device time of one replay of the metadata graph (CUDA
  events around a run of replays), i.e. what the recorded kernel costs the GPU.

A backend with a host planner (flashinfer) runs, in both the compiled and the
eager column, FlashInfer's real ``plan()`` where FlashInfer is installed on a
GPU (graph-mode decode wrapper for compiled, a plain one for eager; 32 query
and 8 KV heads of 128, bf16), else the CPU stand-in of ``backends/reference.py``;
the table's title says which, so a stand-in is never measured silently.

Host time is measured around each step without synchronising (the device
work per step is tiny, so the loop is host-bound); medians are reported.
"""

from __future__ import annotations

import functools
import importlib.util
import statistics
import time
from collections.abc import Callable

import attrs
import torch

from attnmeta.backends import get_eager
from attnmeta.backends.dsv4.compress import speculative
from attnmeta.compiler import CompileOptions, OptionsError, backend_options, compile_backend
from attnmeta.runtime import ForwardBatch, ForwardMode, ReplayView, new_graph
from attnmeta.runtime.planning import Site

from .table import table

D = 4  # draft tokens per request in target verify and draft extend
STEPS = 3  # a multi-step drafter's steps


def _batches(n: int, bs: int, L: int, rows: int, dev, seed: int, mode=ForwardMode.DECODE,
             slots: int = 0) -> list[ForwardBatch]:
    """``slots``: give each query token a KV slot below it on the device (``out_cache_loc``, DSV4)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(D, L // 2 + 1, (bs,), generator=g, dtype=torch.int32)
        rpi = (torch.randperm(rows - 1, generator=g)[:bs] + 1).to(torch.int64)
        fb = ForwardBatch(mode, bs, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                          seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        if slots:
            per = 1 if mode.is_decode() else D
            fb.out_cache_loc = torch.randint(1, slots, (bs * per,), generator=g).to(dev)
        if mode.is_draft_extend():  # the accepted tokens of each request, 1..D
            ext = torch.randint(1, D + 1, (bs,), generator=g, dtype=torch.int32)
            fb.extend_seq_lens, fb.extend_seq_lens_cpu = ext.to(dev), ext
        out.append(fb)
    return out


def _time(step: Callable[[int], None], iters: int, warmup: int, dev) -> float:
    for i in range(warmup):
        step(i)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    ts = []
    for i in range(iters):
        t0 = time.perf_counter()
        step(i)
        ts.append(time.perf_counter() - t0)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def _gpu_time(g, iters: int) -> float:
    """Device µs per replay of the metadata graph: events around ``iters`` back-to-back replays."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        g.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


HEADS = (32, 8, 128)  # query heads, KV heads, head dim: what FlashInfer's plan() is asked to plan for
PLANNED = {"flashinfer"}  # the benched backends with a host planner in out_graph


def planner_for(backend: str, dev, choice: str = "auto") -> str:
    """Which planner the flashinfer columns run: 'flashinfer' (FlashInfer's real wrappers; the compiled
    step plans on the GPU in the graph), 'flashinfer-host' (the compiled step calls FlashInfer's host
    planner every step), 'stand-in', or 'none'."""
    if backend.removeprefix("tbo_").removeprefix("multistep_") not in PLANNED:
        if choice != "auto":  # was ignored: the table then looked like the planner's
            raise OptionsError(f"--planner {choice}: {backend!r} plans nothing on the host (the planners bench "
                               f"measures are FlashInfer's: --backend {', '.join(sorted(PLANNED))}); leave --planner "
                               "out")
        return "none"
    real = dev.type == "cuda" and importlib.util.find_spec("flashinfer") is not None
    if choice == "auto":
        return "flashinfer" if real else "stand-in"
    if choice.startswith("flashinfer") and not real:
        raise OptionsError(f"--planner {choice} needs a CUDA device and FlashInfer (pip install -e '.[flashinfer]'); "
                           "leave --planner out (auto: the CPU stand-in here)")
    return choice


def planner_label(planner: str) -> str:
    if planner.startswith("flashinfer"):
        import flashinfer

        compiled = ("FlashInfer's host planner every step (decode: its C++ planner alone; prefill: plan())"
                    if planner == "flashinfer-host" else "the split-KV partition planned on the GPU in the graph")
        return (f"planner: FlashInfer {flashinfer.__version__}; compiled: {compiled}; eager: plan() every step "
                "(graph-mode wrapper)")
    if planner == "stand-in":
        return ("planner: STAND-IN (backends/reference.py, CPU bookkeeping; not FlashInfer's plan() cost, "
                "which needs FlashInfer on a GPU)")
    return "planner: none (no host planner in this backend)"


def _eager_step(eager, planner: str, dev, max_bs: int, mode=ForwardMode.DECODE):
    """The eager twin's step; with a planner, also the plan() an engine's eager path calls."""
    if planner == "none":
        return eager.init_forward_metadata
    if not mode.is_decode():
        return _eager_prefill_step(eager, planner, dev, max_bs, mode)
    if planner == "stand-in":
        from attnmeta.backends.flashinfer.planner import PLANNER
        from attnmeta.backends.reference import ReferenceDecodePlanner

        plan, site = ReferenceDecodePlanner(), Site.detached(PLANNER, mode, max_bs)

        def step(fb):
            m = eager.init_forward_metadata(fb)
            for indptr, _ in _host_plans(m):
                plan(site, indptr, torch.ones(indptr.shape[0] - 1, dtype=torch.int32))
        return step
    import flashinfer

    # the same kernel choice as the compiled path's adapter (tensor cores for GQA >= 4, SGLang's rule)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(_workspace(mode), dtype=torch.uint8, device=dev),
                                                      "NHD", use_tensor_cores=HEADS[0] // HEADS[1] >= 4)
    ones = torch.ones(max_bs, dtype=torch.int32)  # page size 1: every last page holds one token

    def step(fb):
        m = eager.init_forward_metadata(fb)
        for indptr, indices in _host_plans(m):
            w.plan(indptr, indices, ones[: indptr.shape[0] - 1], *HEADS, 1,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    return step


def _workspace(mode) -> int:
    """FlashInfer's workspace: SGLang's default for decode; the prefill wrapper's split-KV scratch for
    D query rows per request at bs 256 needs more (about 600 MiB on an H200)."""
    from attnmeta.backends.flashinfer_lib import WORKSPACE_BYTES

    return WORKSPACE_BYTES if mode.is_decode() else 1 << 30


def _host_plans(m) -> list:
    """(host indptr, kv indices) of every decode plan the eager metadata asks for: one, or one per
    draft step of a multi-step drafter (``step{i}_kv_indptr_host``)."""
    fields = vars(m)
    return [(v, fields[k.replace("kv_indptr_host", "kv_indices")]) for k, v in fields.items()
            if k.endswith("kv_indptr_host")]


def _eager_prefill_step(eager, planner: str, dev, max_bs: int, mode):
    """Target verify and draft extend the way an engine's eager path plans them: host indptrs (a
    strided query indptr, the keys' from the host lengths), then the prefill planner; in verify
    FlashInfer packs the drafter's tree mask, handed over on the device as engines do."""
    verify = mode.is_target_verify()
    if planner == "stand-in":
        from attnmeta.backends.flashinfer.planner import PREFILL_PLANNER
        from attnmeta.backends.reference import ReferencePrefillPlanner

        plan = functools.partial(ReferencePrefillPlanner(), Site.detached(PREFILL_PLANNER, mode, max_bs))
    else:
        import flashinfer

        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(_workspace(mode), dtype=torch.uint8, device=dev), "NHD", backend="fa2")
        ones = torch.ones(max_bs, dtype=torch.int32, device=dev if verify else "cpu")
        mask = torch.ones(max_bs * D * (eager.req_to_token.shape[1] + D), dtype=torch.bool, device=dev)

        def plan(qo, kv):
            n = D * int(kv[-1]) if verify else 0
            if verify:  # as engines call it: indptrs on the device, FlashInfer packs the mask and reads them back
                qo, kv = qo.to(dev), kv.to(dev)
            w.plan(qo, kv, torch.empty(0, dtype=torch.int32, device=dev), ones[: qo.shape[0] - 1], *HEADS[:2],
                   HEADS[2], 1, custom_mask=mask[:n] if verify else None, causal=not verify,
                   q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)

    def step(fb):
        m = eager.init_forward_metadata(fb)
        qo = torch.arange(0, (fb.batch_size + 1) * D, D, dtype=torch.int32)
        plan(qo, m.kv_indptr_host)
    return step


def _captured(compiled, pool, dev, bs, planner: str, mode=ForwardMode.DECODE, pools=None):
    be = compiled.instantiate(pool, device=dev, pools=pools)
    if planner.startswith("flashinfer"):
        from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter

        FlashInferDecodeAdapter(be, *HEADS, workspace_bytes=_workspace(mode),
                                partition="host" if planner == "flashinfer-host" else "device")
    cap = _batches(1, bs, 64, pool.shape[0], dev, seed=99, mode=mode, slots=_slots(pools))[0]
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    be.init_forward_metadata_in_graph(cap)  # warm-up: Triton compile, allocator
    if dev.type == "cuda":
        torch.cuda.synchronize()
    g = new_graph(dev)
    with g.capture():
        be.init_forward_metadata_in_graph(cap)
    return be, g


def _slots(pools) -> int:
    return pools["full_to_swa"].shape[0] if pools else 0


def _bench_bs(bs, packed, pool, eager, dev, iters, warmup, L, planner, mode=ForwardMode.DECODE, pools=None) -> dict:
    batches = _batches(8, bs, L, pool.shape[0], dev, seed=bs, mode=mode, slots=_slots(pools))
    be, g = _captured(packed, pool, dev, bs, planner, mode, pools)
    b = be.bound(mode, bs)
    nbytes = b.stager.copies[0][1].numel()
    host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=dev.type == "cuda")
    devbuf = torch.zeros(nbytes, dtype=torch.uint8, device=dev)

    def floor(i):
        devbuf.copy_(host, non_blocking=True)
        g.replay()

    def compiled(i):
        be.init_forward_metadata_out_graph(ReplayView.of(batches[i % 8], bs))
        g.replay()

    def validate(i):  # what staging spends checking the batch, on the rows it just staged
        for s in b.stager.slots:
            if not s.full_range:
                s._check_staged(bs * s.per_row, False, s.source)

    steps = [
        ("floor", floor), ("compiled", compiled),
        ("eager", lambda i: eager(batches[i % 8])),
        # where the compiled step's time goes, each part alone
        ("stage", lambda i: b.stager.fast(batches[i % 8], bs, bs)),
        ("validate", validate),
        ("host_ops", lambda i: b.out_fn(*b.out_args)),
        ("replay", lambda i: g.replay()),
    ]
    t = {name: _time(fn, iters, warmup, dev) for name, fn in steps}
    gpu = round(_gpu_time(g, iters), 2) if dev.type == "cuda" else None  # no device time on a CPU
    return {"bs": bs, **{f"{k}_us": round(v, 1) for k, v in t.items()}, "gpu_us": gpu,
            "compiled/floor": round(t["compiled"] / t["floor"], 2),
            "eager/compiled": round(t["eager"] / t["compiled"], 2), "staged_bytes": nbytes}


def run_bench(backend: str = "flashinfer", sizes=(1, 8, 64, 256), iters: int = 300, warmup: int = 30,
              max_context_len: int = 4096, device: str | None = None, progress=lambda xs, *a, **k: xs,
              planner: str = "auto", mode: str = "decode", plan_on_device: bool = False) -> tuple[list[dict], str]:
    """The rows of the table and the planner they ran (``planner_for``); ``progress`` wraps the
    loop over sizes (the CLI passes a progress bar)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    planner = planner_for(backend, dev, planner)
    max_bs, L, fm = max(sizes), max_context_len, ForwardMode.parse(mode)
    if plan_on_device and planner == "flashinfer-host":
        raise OptionsError("--plan-on-device leaves no host indptrs to plan from: drop --planner flashinfer-host")
    page = _page_size(backend)
    own = backend_options(backend, **({"plan_on_device": True} if plan_on_device else {}))
    packed = compile_backend(backend, CompileOptions(max_bs=max_bs, capture_sizes=sizes, max_context_len=L,
                                                     modes=(fm,), num_draft_tokens=D, num_steps=STEPS,
                                                     backend=own, page_size=page))
    rows = max_bs + 1
    pool = torch.randperm(rows * L).to(torch.int32).view(rows, L).to(dev)
    pool[0] = 0
    pools, twin = None, get_eager(backend)
    if backend == "dsv4":  # the full->SWA slot table; the twin builds the compressor plans for the same rings
        pools = {"full_to_swa": torch.randperm(rows * L).to(torch.int32).to(dev)}
        twin = functools.partial(twin, full_to_swa=pools["full_to_swa"], draft_tokens=D,
                                 speculative=speculative((fm,)))
    eager = _eager_step(twin(pool, max_bs), planner, dev, max_bs, fm)
    if backend.startswith("tbo_"):
        eager = _tbo_step(eager)
    rows = [_bench_bs(bs, packed, pool, eager, dev, iters, warmup, L, planner, fm, pools)
            for bs in progress(sizes, f"bench {backend}", unit="size")]
    return rows, planner


def _page_size(backend: str) -> int:
    """Token slots (page size 1), or the smallest page a paged-only kernel takes (FlashMLA's 64, TRT-LLM
    MLA's 32): the pool's slots are random either way, so the pages are too, as much as any timing needs."""
    from attnmeta.compiler import get_spec

    served = get_spec(backend).page_sizes
    return 1 if not served or 1 in served else min(served)


def _tbo_step(inner_step):
    """Two-batch overlap the way engines run it eagerly: the whole batch, then each half as a child
    batch of its own (rows [0, bs//2) and [bs//2, bs)), each with its own metadata and plan."""
    def sub(fb, lo: int, hi: int):
        cut = {f.name: getattr(fb, f.name)[lo:hi] for f in attrs.fields(type(fb))
               if isinstance(getattr(fb, f.name), torch.Tensor)}
        return attrs.evolve(fb, batch_size=hi - lo, seq_lens_sum=None, **cut)

    def step(fb):
        inner_step(fb)
        half = fb.batch_size // 2
        for lo, hi in ((0, half), (half, fb.batch_size)):
            if hi > lo:
                inner_step(sub(fb, lo, hi))
    return step


def format_table(rows: list[dict], device: str, planner: str = "none", mode: str = "decode",
                 plan_on_device: bool = False) -> str:
    """Markdown, so that a run's table pastes into docs/BENCHMARKS.md as it is."""
    cols = ["bs", "floor_us", "compiled_us", "eager_us", "compiled/floor", "eager/compiled",
            "stage_us", "validate_us", "host_ops_us", "replay_us", "gpu_us", "staged_bytes"]
    return table(rows, cols, markdown=True, title=f"host time per {mode} step on {device} (median µs); "
                 f"{planner_label(planner)}"
                 f"{'; compiled with plan_on_device (no host indptrs)' if plan_on_device else ''}")
