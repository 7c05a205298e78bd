"""attnmeta's SGLang-facing step against SGLang's own backends, side by side in one process.

    python tools/bench_sglang.py [--kinds triton,flashinfer] [--pages 1,16] [--sizes 1,8,64,256]
                                 [--iters 200] [--eagle-sizes 1,8,32] [--json out.json]

Both backends are built by SGLang from the same flags on the same ``ModelRunner`` (pools, config;
``tests/integrations/sglang_server.Server``): SGLang's own ``triton`` / ``flashinfer`` backend and
attnmeta's ``attnmeta_triton`` / ``attnmeta_flashinfer``. Each captures its graphs per size the way
SGLang's graph runners do (out_graph with ``in_capture``, in_graph recorded), then serves the same
batches: decode at every size (lengths uniform in 1..2048, random pool rows), and with EAGLE's flags
target verify (SGLang's tree masks) and draft extend V2.

A timed step is what SGLang's graph runner spends on the host for the backend: decode and verify,
SGLang's own ``build_replay_fb_view`` on the runner's padded buffers + ``init_forward_metadata_out_graph
(view)`` + ``graph.replay()``; draft extend, out_graph on the draft-extend runner's view + replay (the
view is built before the clock starts, the same for both). The device is idle when a step starts
(synchronized before, outside the clock). ``core`` is attnmeta's compiled backend alone on the same
batches (its out_graph on a filled view + the same replay): the SGLang-facing layer costs
``attnmeta - core``. ``floor`` is the harness with no backend in it: the same view + replaying a graph
of one kernel, the least any backend's step can cost here; ``over`` is attnmeta's step minus it; ``a 2nd
node`` is what the same floor costs more with two kernels in its graph (what one more graph node costs on
this host). Every timer runs step by step beside the others, in one order then the reverse (SGLang first,
then the floor first); medians per timer.

After every timed step, outside the clock, the rows each side's kernels read are copied; at the end
every step's copies are compared field by field (triton: SGLang's ``ForwardMetadata`` fields;
flashinfer: the index stream in the planned wrappers). ``equal`` counts the steps that matched.
Needs CUDA, SGLang's Python code and FlashInfer (docs/SGLANG.md, "On the H200").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, __file__.rsplit("/tools/", 1)[0])

from tests.integrations.sglang_server import (  # noqa: E402 - the repository root first
    Runners,
    Server,
    decode,
    draft_extend,
    draft_extend_view,
    padded,
    rows_read,
    verify,
)
from tools.bench_reads import expand_read, flashmla_read, mla_read, stream, trtllm_read  # noqa: E402

SYNC = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
FIELDS = {"decode": ("kv_indptr", "kv_indices", "num_kv_splits"),
          "verify": ("kv_indptr", "kv_indices", "qo_indptr", "mask_indptr", "custom_mask"),
          "extend": ("kv_indptr", "kv_indices", "qo_indptr")}
STREAM = ("_paged_kv_indptr_buf", "_paged_kv_indices_buf", "_paged_kv_last_page_len_buf", "_qo_indptr_buf")


# SGLang's registry name of a kind: FlashInfer on an MLA model is "mla" here; "mla-device" is the same with
# attnmeta's in-graph MLA partition (ATTNMETA_PLANNER=device) in place of FlashInfer's C++ planner per step;
# "flashmla" is FlashMLA (on DeepSeek-V3's 128 heads: its schedule's part count depends on them); "fa3-tree" is
# fa3 under EAGLE's defaults (topk 4): its verify is the prefix and the tree's expansion
OWN = {"mla": "flashinfer", "mla-device": "flashinfer", "fa3-tree": "fa3"}
MLA_MODELS = ("mla", "mla-device", "flashmla")
CHAIN = MLA_MODELS + ("trtllm_mha", "fa3")  # kinds whose EAGLE verifies a chain (topk 1) here
MODES = {"mla": ("verify",), "mla-device": ("verify",)}  # SGLang's FlashInfer MLA captures no draft extend graph
PLANNER = {"mla": "host", "mla-device": "device"}


def flags(kind: str, page: int, sizes, eagle: bool) -> list[str]:
    f = ["--attention-backend", f"attnmeta_{OWN.get(kind, kind)}", "--page-size", str(page),
         "--cuda-graph-bs-decode", *map(str, sizes), "--max-running-requests", str(max(sizes) + 8)]
    if eagle and kind in CHAIN:  # FlashInfer MLA, FlashMLA and TRT-LLM MHA verify a chain (topk 1), causal
        return f + ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1", "--speculative-num-steps",
                    "3", "--speculative-num-draft-tokens", "4"]
    return f + ["--speculative-algorithm", "EAGLE"] if eagle else f




class Side:
    """One backend under its runner: its step on a prepared batch, and a copy of what its kernels read."""

    def __init__(self, name, backend, runner: Runners, mode: str, kind: str):
        self.name, self.backend, self.runner, self.mode, self.kind = name, backend, runner, mode, kind
        self.times: dict[int, list[float]] = {}
        self.seen: dict[tuple, dict] = {}

    def step(self, prep) -> float:
        g = self.runner.graphs[(self.mode, prep.bs)]
        make = load(self.runner, self.mode, prep)  # the runner's copies into its buffers: before the clock
        t0 = time.perf_counter()
        view = make()
        t1 = time.perf_counter()
        self.backend.init_forward_metadata_out_graph(view)
        t2 = time.perf_counter()
        g.replay()
        t3 = time.perf_counter()
        PARTS[self.name].append((t1 - t0, t2 - t1, t3 - t2))
        return t3 - t0

    def read(self, prep) -> dict:
        be, live = self.backend, prep.live
        mine = self.name == "attnmeta"
        if self.kind.startswith("mla"):
            return mla_read(be, mine, self.mode, prep)
        if self.kind == "flashmla":
            return flashmla_read(be.forward_metadata, self.mode, prep)
        if self.kind in ("trtllm_mha", "fa3", "fa3-tree"):  # FA3's kernel reads what TRT-LLM MHA's reads
            out = trtllm_read(be.forward_metadata, prep, self.runner.server.runner.page_size)
            tree = getattr(be, "forward_metadata_spec_decode_expand", None)
            if tree is not None:  # topk > 1 verify: each draft query's visible drafts, by slot
                out |= expand_read(tree, prep.live * prep.fb.spec_info.draft_token_num)
            return out
        if self.kind == "flashinfer":
            if mine:
                md = be.forward_metadata
                ws = md.decode_wrappers if self.mode == "decode" else md.prefill_wrappers
            else:
                table = {"decode": be.decode_cuda_graph_metadata, "verify": be.prefill_cuda_graph_metadata,
                         "extend": be.draft_extend_cuda_graph_metadata}[self.mode]
                ws = table[prep.bs]
            return stream(ws[0], live)
        if mine:
            md = be.forward_metadata
        else:
            md = be._build_cuda_graph_forward_metadata(prep.bs, prep.sglang_mode, prep.fb.spec_info)
        return {f: (v.clone() if isinstance(v, torch.Tensor) else v)
                for f in FIELDS[self.mode] for v in [rows_read(md, md, f, live)[0]]}










def load(runner, mode: str, prep):
    """What SGLang's graph runner does before it calls the backend: the batch copied into the buffers the
    graph was captured on (rows, lengths and their host mirror, draft extend's lengths; the tree mask into
    the backend's verify buffer where it owns one, as EAGLE's worker writes it). Returns the step's view
    maker: SGLang's own ``build_replay_fb_view`` over those buffers (decode, verify), or the draft-extend
    runner's view."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

    if mode == "extend":
        v = draft_extend_view(prep.fb, prep.bs, runner.fill, runner.width)
        runner.prepare(mode, v)
        return lambda: v
    static = runner.static[(mode, prep.bs)]
    static.seq_lens.copy_(prep.seq)
    static.req_pool_indices.copy_(prep.rows)
    cpu = static.seq_lens_cpu
    cpu.copy_(prep.seq_cpu)
    if prep.mask is not None:  # the drafter's mask of this step (another side's runner may have re-pointed it)
        prep.fb.spec_info.custom_mask = prep.mask
    probe = SimpleNamespace(forward_mode=prep.fb.forward_mode, batch_size=prep.bs, spec_info=prep.fb.spec_info)
    runner.prepare(mode, probe)  # the tree mask (seq_lens and rows are already in place)
    bufs = SimpleNamespace(input_ids=prep.bufs.input_ids, positions=prep.bufs.positions,
                           req_pool_indices=static.req_pool_indices, seq_lens=static.seq_lens, seq_lens_cpu=cpu,
                           encoder_lens=None, mamba_track_indices=None)
    bs, w = prep.bs, runner.width
    return lambda: build_replay_fb_view(prep.fb, bufs, bs, bs, bs * w, None, runner.fill, prep.sglang_mode, False)


def core_step(backend, runner, mode, prep) -> float:
    """attnmeta's compiled backend alone: its out_graph on the filled view, the same replay."""
    from attnmeta.integrations.sglang.batch import BatchView

    g = runner.graphs[(mode, prep.bs)]
    v = BatchView(runner.width if mode == "extend" else 0).fill(load(runner, mode, prep)())
    t0 = time.perf_counter()
    backend.attnmeta.init_forward_metadata_out_graph(v)
    g.replay()
    return time.perf_counter() - t0


class Floor:
    """The harness's floor: the step's view (built as SGLang's runner builds it) + the replay of a graph that
    records ``kernels`` kernels (1: the least any backend's step can cost here; 2: what one more graph node
    costs), no backend called."""

    def __init__(self, runner: Runners, mode: str, kernels: int = 1):
        from attnmeta.runtime import new_graph

        self.runner, self.mode, self.graphs, self.kernels = runner, mode, {}, kernels
        self.x = torch.zeros(1, device=runner.server.device)
        for bs in runner.sizes:
            g = new_graph(torch.device(runner.server.device))
            with g.capture():
                for _ in range(kernels):
                    self.x.add_(1)
            self.graphs[bs] = g

    def step(self, prep) -> float:
        g = self.graphs[prep.bs]
        make = load(self.runner, self.mode, prep)
        t0 = time.perf_counter()
        make()
        t1 = time.perf_counter()
        g.replay()
        t2 = time.perf_counter()
        PARTS[f"floor{self.kernels}"].append((t1 - t0, 0.0, t2 - t1))
        return t2 - t0


def trtllm_counter_standin() -> None:
    """SGLang's TRT-LLM backends size a persistent multi-CTA counter buffer with a FlashInfer helper that
    FlashInfer 0.6.4 lacks. Where it is missing, stand it in (one int32 per SM, row and head: a size, no
    kernel) and say so: the buffer is allocated at ``__init__`` and only trtllm-gen's attention kernel
    (Blackwell) reads it; no metadata step does."""
    import flashinfer.utils as fu

    if not hasattr(fu, "get_trtllm_gen_multi_ctas_kv_counter_bytes"):
        fu.get_trtllm_gen_multi_ctas_kv_counter_bytes = lambda bs, heads, sms: 4 * bs * heads * sms
        print("stand-in: flashinfer.utils.get_trtllm_gen_multi_ctas_kv_counter_bytes (missing from this "
              "FlashInfer; sizes a buffer only Blackwell's attention kernel reads)", flush=True)


def prepare(s: Server, mode: str, bs: int, n: int, fill: int, width: int, rng: random.Random) -> list:
    """``n`` batches of ``bs`` live rows, with the runner's padded buffers and the view built per step."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    out = []
    for i in range(n):
        rows = rng.sample(range(1, s.rows), bs)
        seq = [rng.randint(1, 2048) for _ in range(bs)]
        p = SimpleNamespace(bs=bs, live=bs)
        if mode == "extend":
            p.fb = draft_extend(s, rows, seq)
            p.sglang_mode = p.fb.forward_mode
        else:
            p.fb = decode(s, rows, seq) if mode == "decode" else verify(s, rows, seq, random.Random(i))
            p.sglang_mode = ForwardMode.DECODE if mode == "decode" else ForwardMode.TARGET_VERIFY
            p.mask = getattr(p.fb.spec_info, "custom_mask", None)
            p.seq, p.rows, raw = padded(p.fb, bs, fill)
            p.seq_cpu, dev = p.seq.cpu(), p.seq.device
            p.bufs = SimpleNamespace(input_ids=torch.zeros(bs * width, dtype=torch.int64, device=dev),
                                     positions=torch.zeros(bs * width, device=dev))  # the view: per step (load)
        out.append(p)
    return out


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (torch.equal(a[k].long(), b[k].long()) if isinstance(a[k], torch.Tensor) else a[k] == b[k]) for k in a)


def bench(s: Server, kind: str, mode: str, sizes, iters: int, rng) -> list[dict]:
    eagle = mode != "decode"
    D = s.spec.speculative_num_draft_tokens if eagle else 1
    if mode == "extend":
        ours_be, own_be = s.draft_extend, s.own_drafters(OWN.get(kind, kind))[1]
    else:
        ours_be, own_be = s.backend, s.own(OWN.get(kind, kind))
    make = {"decode": lambda bs, r: decode(s, [0] * bs, [r.fill] * bs),
            "verify": lambda bs, r: verify(s, [0] * bs, [r.fill] * bs, random.Random(bs)),
            "extend": lambda bs, r: draft_extend(s, [0] * bs, [1] * bs)}[mode]
    sides = []
    for name, be in (("sglang", own_be), ("attnmeta", ours_be)):
        r = Runners(s, be, kind, D)
        r.sizes = [x for x in r.sizes if x in sizes]
        with s.active():
            r.capture(lambda bs, r=r: make(bs, r), mode)
        sides.append(Side(name, be, r, mode, kind))
    rows = []
    floors = {f"floor{k}": Floor(sides[1].runner, mode, k) for k in (1, 2)}
    for bs in [x for x in sizes if x in sides[0].runner.sizes]:
        preps = prepare(s, mode, bs, iters, sides[0].runner.fill, D, rng)
        # every timer step by step, in one order then the reverse, so drift of the host's speed over the run
        # falls on all of them alike (the floor is compared with attnmeta's step, so it is timed beside it)
        timers = [(side.name, side.step) for side in sides]
        timers += [("core", lambda p: core_step(ours_be, sides[1].runner, mode, p))] + \
                  [(k, f.step) for k, f in floors.items()]
        t = {name: [] for name, _ in timers}
        PARTS.clear()
        reads = {"sglang": [], "attnmeta": []}
        with s.active():
            for order in (timers, timers[::-1]):
                for p in preps:
                    for name, step in order:
                        SYNC()
                        t[name].append(step(p))
                        SYNC()
                        if order is timers and name in reads:  # one block's copies compare every step
                            reads[name].append(next(x for x in sides if x.name == name).read(p))
        t["floor"] = t.pop("floor1")
        med = {k: statistics.median(v) * 1e6 for k, v in t.items()}
        half = {k: (statistics.median(v[:iters]) * 1e6, statistics.median(v[iters:]) * 1e6)
                for k, v in t.items() if k in ("sglang", "attnmeta")}
        ok = sum(equal(a, b) for a, b in zip(reads["sglang"], reads["attnmeta"], strict=True))
        if kind.startswith("mla"):  # which half differs, if any: the indices or FlashInfer's plan words
            pairs = list(zip(reads["sglang"], reads["attnmeta"], strict=True))
            same = {k: sum(torch.equal(a[k], b[k]) for a, b in pairs) for k in ("kv_indices", "plan")}
            print(f"  mla {mode} bs {bs}: kv_indices equal {same['kv_indices']}, plan words equal {same['plan']}",
                  flush=True)
        rows.append(dict(kind=kind, page=s.runner.page_size, mode=mode, bs=bs, sglang_us=med["sglang"],
                         attnmeta_us=med["attnmeta"], core_us=med["core"], floor_us=med["floor"],
                         floor2_us=med["floor2"],
                         over_us=med["attnmeta"] - med["floor"], by_order=half,
                         ratio=med["sglang"] / med["attnmeta"], layer_us=med["attnmeta"] - med["core"],
                         equal=ok, steps=len(preps)))
        rows[-1]["parts_us"] = {k: [statistics.median(x[i] for x in v) * 1e6 for i in range(3)]
                                for k, v in PARTS.items()}
        print(table_row(rows[-1]), flush=True)
        print("  parts (view / out_graph / replay µs): " + "; ".join(
            f"{k} {a:.1f} / {b:.1f} / {c:.1f}" for k, (a, b, c) in rows[-1]["parts_us"].items()), flush=True)
        if PROFILE and bs == PROFILE:
            profile(sides[1], preps, f"{kind} page {s.runner.page_size} {mode} bs {bs}")
    return rows


PARTS: dict = collections.defaultdict(list)  # timer -> (view, out_graph, replay) seconds of each step
PROFILE = 0  # --profile BS: where attnmeta's step spends its host time, at that batch size


def profile(side: Side, preps: list, what: str) -> None:
    import cProfile
    import pstats

    pr = cProfile.Profile()
    with side.runner.server.active():
        pr.enable()
        for p in preps:
            side.step(p)
        pr.disable()
    SYNC()
    print(f"--- profile of attnmeta's step, {what}, {len(preps)} steps (cProfile adds its own cost) ---")
    pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(14)


def table_row(r: dict) -> str:
    return (f"| {r['kind']} | {r['page']} | {r['mode']} | {r['bs']} | {r['sglang_us']:.0f} | {r['attnmeta_us']:.0f} "
            f"| {r['core_us']:.0f} | {r['layer_us']:+.0f} | {r['floor_us']:.0f} "
            f"| {r['floor2_us'] - r['floor_us']:+.0f} | {r['over_us']:+.0f} "
            f"| {r['ratio']:.1f}x | {r['equal']}/{r['steps']} |")


HEADER = ("| kind | page | mode | bs | SGLang's own µs | attnmeta µs | core µs | layer µs | floor µs | a 2nd node µs "
          "| over floor µs | SGLang / attnmeta | equal steps |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def save(path: str | None, rows: list[dict]) -> None:
    """As the run goes, so a run cut short keeps what it measured."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def pin(which: str) -> str:
    """Pin this process (every thread it starts after) to one CPU; what it did, for the output."""
    allowed = sorted(os.sched_getaffinity(0))
    if which != "auto":
        cpu = int(which)
        if cpu not in allowed:
            raise SystemExit(f"bench_sglang: --pin {cpu}: this process may run on CPUs {allowed} only")
    else:
        local = allowed
        try:  # the CPUs next to the GPU (its NUMA node), where the kernel says which
            d = torch.cuda.get_device_properties(0)
            bus = f"{d.pci_domain_id:04x}:{d.pci_bus_id:02x}:{d.pci_device_id:02x}.0"
            with open(f"/sys/bus/pci/devices/{bus}/local_cpulist") as f:
                spans = [tuple(int(x) for x in r.split("-")) for r in f.read().strip().split(",") if r]
            near = [c for c in allowed if any(lo <= c <= (hi[0] if hi else lo) for lo, *hi in spans)]
            local = near or allowed
        except (AttributeError, OSError, ValueError, RuntimeError):
            pass
        cpu = local[0]
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu} of {len(allowed)}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default="triton,flashinfer",
                    help="triton, flashinfer, mla (FlashInfer on DeepSeek-V2), mla-device (the same, its partition "
                    "planned in the graph), flashmla (FlashMLA, pages of 64: --pages 64 --eagle-pages 64), "
                    "trtllm_mha (TRT-LLM MHA's metadata; pages of 16, 32 or 64), fa3 (FlashAttention-3's; SGLang's "
                    "kernel package, or the stand-in of tests/gpu/standin on PYTHONPATH), fa3-tree (fa3 under EAGLE's "
                    "defaults, topk 4: the tree verify)")
    ap.add_argument("--pages", default="1,16")
    ap.add_argument("--sizes", default="1,8,64,256")
    ap.add_argument("--eagle-sizes", default="1,8,32", help="verify and draft extend sizes ('' skips them)")
    ap.add_argument("--eagle-pages", default="1")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="BS", help="profile attnmeta's step at this size")
    ap.add_argument("--pin", default="", metavar="CPU",
                    help="run on this one CPU (a number, or 'auto': the first this process may use that is local "
                    "to the GPU), as a serving engine pins its scheduler; the host's speed then moves less")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the harness (emulated graphs, triton "
                    "only); its times are not a GPU's")
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_sglang: needs CUDA (it times SGLang's and attnmeta's backends on the GPU); --device cpu "
              "smoke-tests the harness", file=sys.stderr)
        return 2
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    pinned = pin(a.pin) if a.pin else "not pinned"
    global PROFILE
    PROFILE = a.profile
    rng, rows = random.Random(0), []
    where = torch.cuda.get_device_name() if a.device == "cuda" else "CPU smoke run, emulated graphs: not GPU times"
    print(f"torch {torch.__version__}, {where}, host {pinned}\n{HEADER}", flush=True)
    for kind in a.kinds.split(","):
        if kind == "trtllm_mha" and a.device == "cuda":
            trtllm_counter_standin()
        for page in ints(a.pages):
            model = dict(model="deepseek-h128" if kind == "flashmla" else "deepseek") if kind in MLA_MODELS else {}
            os.environ["ATTNMETA_PLANNER"] = PLANNER.get(kind, "device")
            s = Server(flags(kind, page, ints(a.sizes), False), device=a.device, rows=max(ints(a.sizes)) + 40,
                       context=4096, **model)
            rows += bench(s, kind, "decode", ints(a.sizes), a.iters, rng)
            if a.eagle_sizes and page in ints(a.eagle_pages):
                e = Server(flags(kind, page, ints(a.eagle_sizes), True), device=a.device,
                           rows=max(ints(a.eagle_sizes)) + 40, context=4096, **model)
                for mode in MODES.get(kind, ("verify", "extend")):
                    rows += bench(e, kind, mode, ints(a.eagle_sizes), a.iters, rng)
                    save(a.json, rows)
            save(a.json, rows)
    return 0 if all(r["equal"] == r["steps"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
