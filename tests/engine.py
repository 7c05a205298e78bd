"""A serving engine's use of a backend, for tests: every mode the backend serves compiled into ONE
backend, a graph captured per (mode, size) from dummy fill batches, and steps that interleave
DECODE, IDLE, TARGET_VERIFY, DRAFT_EXTEND (and eager EXTEND) at padded, exact and uncaptured
sizes. Each step is checked against two independent oracles: the reference interpreter on the
plan's graph (every row, padding included) and the backend's hand-written eager twin."""

from __future__ import annotations

import random

import attrs
import torch

from attnmeta.backends import get_eager, get_spec
from attnmeta.backends.dsv4.compress import speculative
from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.backends.dsv4.spec import DSV4Options
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import Op, Role, eval_graph
from attnmeta.runtime import EmulatedGraph, ForwardBatch, ReplayView, new_graph
from attnmeta.sim.compare import compare_metadata
from tests.batches import make_pool

M = ForwardMode
GRAPH_MODES = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND)
BACKENDS = ["flashinfer", "flashattention", "flashattention_draft", "triton", "dsv4", "tbo_flashinfer",
            "tbo_flashattention", "tbo_triton", "multistep_flashinfer", "multistep_triton", "flashinfer_mla",
            "tbo_flashinfer_mla", "multistep_flashinfer_mla", "trtllm_mha"]


@attrs.define
class Engine:
    name: str
    opts: CompileOptions
    cb: object
    be: object
    pool: torch.Tensor
    pools: dict
    twin: object
    rows: int
    graphs: dict = attrs.Factory(dict)
    stats: dict = attrs.Factory(dict)

    @property
    def modes(self) -> list[ForwardMode]:
        spec = get_spec(self.name)
        return [m for m in spec.modes] + [M.IDLE]


def build(name: str, max_bs: int = 8, sizes=(1, 3, 4), L: int = 96, D: int = 3, S: int = 2, K: int = 1,
          P: int = 1, rows: int = 14, device="cpu", seed: int = 0, SM: int = 132) -> Engine:
    spec = get_spec(name)
    if name.startswith("dsv4"):
        L = max(L, 520)  # pages of 256 tokens: several of them
    opts = CompileOptions(max_bs=max_bs, capture_sizes=sizes, max_context_len=L, num_draft_tokens=D, num_steps=S,
                          topk=K, page_size=P, sm_count=SM, modes=[m.name.lower() for m in spec.modes] + ["idle"])
    cb = compile_backend(name, opts)
    pool = make_pool(rows, L, seed=seed, device=device)
    pools = {"full_to_swa": swa_table(rows * L + 1, device)} if "dsv4" in name else {}
    be = cb.instantiate(pool, device=device, pools=pools)
    eng = Engine(name, opts, cb, be, pool, pools, _twin(name, pool, opts, pools), rows)
    for mode in (m for m in GRAPH_MODES if m in cb.generic):  # SGLang-style: dummy batches of fill rows
        for bs in sorted(sizes, reverse=True):
            be.init_forward_metadata_out_graph(ReplayView(bs, mode, mode, 0), in_capture=True)
            g = new_graph(torch.device(device))
            be.init_forward_metadata_in_graph(ForwardBatch(mode, bs))  # warm-up
            with g.capture():
                be.init_forward_metadata_in_graph(ForwardBatch(mode, bs))
            eng.graphs[(mode, bs)] = g
    return eng


def _twin(name: str, pool, opts: CompileOptions, pools):
    inner, D, S = name.removeprefix("tbo_"), opts.num_draft_tokens, opts.num_steps
    if name.startswith("multistep_"):
        return get_eager(name)(pool, opts.max_bs, num_steps=S, topk=opts.topk, page_size=opts.page_size)
    cls = get_eager(inner)
    if inner in ("flashattention", "trtllm_mla", "cutedsl_mla", "trtllm_mha"):
        return cls(pool, opts.max_bs, opts.page_size, draft_tokens=D)
    if inner == "flashmla":
        return cls(pool, opts.max_bs, draft_tokens=D, sm_count=opts.sm_count, num_heads=opts.num_heads)
    if inner == "flashattention_draft":
        return cls(pool, opts.max_bs, opts.page_size, num_steps=S)
    if inner == "dsv4":
        own = opts.of(DSV4Options)
        return cls(pool, opts.max_bs, pools["full_to_swa"], draft_tokens=D, index_topk=own.index_topk,
                   sm_count=opts.sm_count, speculative=speculative(opts.modes), ratios=own.compress_ratios)
    return cls(pool, opts.max_bs, draft_tokens=D)


def batch(eng: Engine, mode: ForwardMode, raw: int, rng: random.Random) -> ForwardBatch:
    """A batch the engine could send: distinct pool rows, lengths that fit the mode's headroom."""
    if mode is M.IDLE:
        return ForwardBatch(M.IDLE, 0)
    opts, spec = eng.opts, get_spec(eng.name)
    hi = opts.max_context_len - spec.headroom(mode, opts)
    seq = torch.tensor([rng.choice([1, 2, hi, hi - 1, rng.randint(1, hi)]) for _ in range(raw)], dtype=torch.int32)
    rpi = torch.tensor(rng.sample(range(1, eng.rows), raw), dtype=torch.int64)
    dev = eng.pool.device
    fb = ForwardBatch(mode, raw, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                      seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
    T = opts.num_draft_tokens if mode in (M.TARGET_VERIFY, M.DRAFT_EXTEND) else 1
    if "dsv4" in eng.name:
        slots = eng.pools["full_to_swa"].shape[0]
        fb.out_cache_loc = torch.tensor([rng.randint(1, slots - 1) for _ in range(raw * T)], dtype=torch.int64,
                                        device=dev)
    if mode is M.DRAFT_EXTEND:
        ext = torch.tensor([rng.randint(1, min(T, int(s))) for s in seq], dtype=torch.int32)
        fb.extend_seq_lens, fb.extend_seq_lens_cpu = ext.to(dev), ext
    if mode is M.EXTEND:
        prefix = torch.tensor([rng.randint(0, int(s) - 1) for s in seq], dtype=torch.int32)
        ext = seq - prefix
        fb.extend_prefix_lens, fb.extend_prefix_lens_cpu = prefix.to(dev), prefix
        fb.extend_seq_lens, fb.extend_seq_lens_cpu = ext.to(dev), ext
    return fb


def run(eng: Engine, fb: ForwardBatch) -> int:
    """One step as a graph runner takes it: replay at the smallest captured size holding the batch,
    eagerly past the largest or in a mode never captured. Returns the size the metadata has."""
    key = fb.forward_mode.graph_key
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    sizes = sorted(bs for m, bs in eng.graphs if m is key)
    bs = next((s for s in sizes if s >= max(raw, 1)), None)
    if bs is None:
        eng.stats["eager"] = eng.stats.get("eager", 0) + 1
        eng.be.init_forward_metadata(fb)
        return fb.batch_size
    eng.stats["replay"] = eng.stats.get("replay", 0) + 1
    eng.be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
    eng.graphs[(key, bs)].replay()
    return bs


def padded_inputs(g, fb: ForwardBatch, bs: int, pools: dict) -> dict[str, torch.Tensor]:
    """The plan's inputs as the graph sees them: live rows, then each input's fill (the oracle's own
    padding, written from the spec's declarations, not the runtime's staging)."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    out = {}
    for i in g.inputs:
        if i.role is Role.pool:
            out[i.name] = pools[i.name].cpu()
            continue
        if i.role.guard:  # the device guard's: the interpreter's own step staged from the host
            continue
        per = int(i.type.shape[0]) // bs if bs else 1
        src = getattr(fb, i.source, None)
        src = getattr(fb, i.name, None) if src is None else src
        live = torch.as_tensor(src).reshape(-1)[: raw * per].cpu() if raw else torch.zeros(0, dtype=torch.int64)
        pad = torch.full((bs * per - live.numel(),), i.fill or 0, dtype=i.type.dtype.torch)
        out[i.name] = torch.cat([live.to(i.type.dtype.torch), pad])
    return out


def check(eng: Engine, fb: ForwardBatch, bs: int) -> list[str]:
    """Fields of this step's metadata that differ from an oracle (empty: all equal)."""
    mode = fb.forward_mode
    plan = eng.cb.plan(mode, bs)
    ins = padded_inputs(plan.graph, fb, bs, {"req_to_token": eng.pool, **eng.pools})
    want = eval_graph(plan.graph, ins)
    meta, bad = eng.be.forward_metadata, []
    ragged = {o.field: o.ragged_by for o in plan.graph.outputs}
    planned = _planner_written(plan.graph)
    for field, w in want.items():
        if not isinstance(w, torch.Tensor) or field in planned:
            continue
        got = torch.as_tensor(getattr(meta, field)).cpu()
        if ragged.get(field):
            n = int(want[ragged[field]][-1])
            got, w = got[:n], w[:n]
        if got.shape != w.shape or not torch.equal(got, w):
            bad.append(f"{field} (interpreter)")
    twin_mode = M.DECODE if mode.is_idle() else mode
    if twin_mode is M.EXTEND or eng.name == "flashattention_draft" and twin_mode is not M.DECODE:
        return bad
    ref = eng.twin.init_forward_metadata(_twin_batch(eng, fb, twin_mode, bs, ins))
    bad += [f"{f} (eager twin)" for f in compare_metadata(meta, ref, *_lens(eng, twin_mode, ins))]
    return bad


def _planner_written(g) -> set[str]:
    """Fields a planner writes on the device (FlashMLA's schedule): bound by a host_call to a constant
    the graph itself never computes. The interpreter knows no planner; the eager twin checks them."""
    nodes = g.producers()
    written = {v for n in g.nodes if n.op is Op.host_call for v in n.a["binds"].values()
               if v in nodes and nodes[v].op is Op.full}
    return {o.field for o in g.outputs if o.value in written}


def _twin_batch(eng, fb, mode, bs, ins) -> ForwardBatch:
    dev = eng.pool.device
    get = {k: v.to(dev) for k, v in ins.items()}
    return ForwardBatch(mode, bs, req_pool_indices=get["req_pool_indices"], seq_lens=get["seq_lens"],
                        seq_lens_cpu=ins["seq_lens"].clone(), seq_lens_sum=int(ins["seq_lens"].sum()),
                        out_cache_loc=get.get("out_cache_loc"), extend_seq_lens=get.get("extend_seq_lens"),
                        extend_seq_lens_cpu=ins.get("extend_seq_lens"))


def _lens(eng, mode, ins) -> tuple[torch.Tensor, int]:
    """Per row of the page table, the tokens it covers (the columns compared), and the page size."""
    seq, D, P = ins["seq_lens"], eng.opts.num_draft_tokens, eng.opts.page_size
    inner = eng.name.removeprefix("tbo_")
    if inner == "dsv4":
        if mode is M.TARGET_VERIFY:
            return (seq[:, None] + 1 + torch.arange(D)).reshape(-1), 256
        if mode is M.DRAFT_EXTEND:  # SGLang's V2 layout: the last D positions, seq - D + 1 .. seq
            return (seq[:, None] - D + 1 + torch.arange(D)).reshape(-1), 256
        return seq, 256
    if inner == "flashattention" and mode is M.TARGET_VERIFY:
        return seq + D, P
    return seq, P


def interleave(eng: Engine, steps: int, seed: int) -> list[tuple[int, str, int, list[str]]]:
    """``steps`` random steps over every mode and sizes 0..max_bs (eager past the largest capture);
    returns the failing steps as (step, mode, raw, fields)."""
    rng = random.Random(seed)
    failures = []
    for step in range(steps):
        mode = rng.choice(eng.modes)
        raw = 0 if mode is M.IDLE else rng.choice([1, rng.randint(1, eng.opts.max_bs), eng.opts.max_bs,
                                                   max(eng.opts.sizes)])
        fb = batch(eng, mode, raw, rng)
        bs = run(eng, fb)
        bad = check(eng, fb, bs)
        if bad:
            failures.append((step, mode.name, raw, bad))
    return failures


__all__ = ["BACKENDS", "EmulatedGraph", "Engine", "build", "check", "interleave", "run"]
