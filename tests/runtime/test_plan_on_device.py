"""FlashInfer specs compiled with ``plan_on_device``: out_graph keeps only the planner node (its
input a constant per size), every device field is what the default compile writes, step by step
with modes interleaved and sizes padded, and the planner is called on every step with the batch
size its wrapper serves (a TBO child's, a draft step's)."""

import random

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import Op, Region
from attnmeta.runtime import ForwardBatch, ReplayView
from attnmeta.sim.compare import compare_metadata
from tests.batches import make_pool
from tests.runtime.test_stagegen import MAX_BS, ROWS, D, L, batch

M = ForwardMode
MODES = {"flashinfer": (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND), "tbo_flashinfer": (M.DECODE,),
         "multistep_flashinfer": (M.DECODE,)}


def options(name: str, **kw) -> CompileOptions:
    modes = (*(m.name.lower() for m in MODES[name]), "idle")
    return CompileOptions(max_bs=MAX_BS, capture_sizes=(4, MAX_BS), max_context_len=L, num_draft_tokens=D,
                          modes=modes, **kw)


@pytest.mark.parametrize("name", list(MODES))
def test_plan_on_device_leaves_only_the_planner_in_out_graph(name):
    on = compile_backend(name, options(name, backend=FlashInferOptions(plan_on_device=True)))
    off = compile_backend(name, options(name))
    for mode in MODES[name]:
        for bs in (4, MAX_BS):
            p = on.plan(mode, bs)
            work = [n for n in p.graph.region_nodes(Region.out_graph) if n.name not in p.consts]
            assert work and all(n.op is Op.host_call for n in work), [n.op for n in work]
            q = off.plan(mode, bs)
            assert any(n.op is Op.cumsum for n in q.graph.region_nodes(Region.out_graph))  # what it saves


@pytest.mark.parametrize("name", list(MODES))
def test_plan_on_device_writes_the_same_device_fields(name):
    pool = make_pool(ROWS, L, 1)
    on = compile_backend(name, options(name, backend=FlashInferOptions(plan_on_device=True))).instantiate(pool)
    off = compile_backend(name, options(name)).instantiate(pool)
    twin = get_eager("flashinfer")(pool, MAX_BS, draft_tokens=D) if name == "flashinfer" else None
    calls = on.planners["flashinfer.decode_plan_on_device"], on.planners["flashinfer.prefill_plan_on_device"]
    rng = random.Random(name)
    for step in range(14):
        mode = rng.choice(MODES[name])
        raw = rng.randint(1, MAX_BS) if step % 5 else 0
        bs = 4 if raw <= 4 else MAX_BS
        fb = batch(mode, raw, rng) if raw else ForwardBatch(M.IDLE, 0)
        view = ReplayView.of(fb, bs) if raw else ReplayView(bs, mode, M.IDLE, 0)
        before = [c.calls for c in calls]
        for be in (on, off):
            be.init_forward_metadata_out_graph(view)
            be.init_forward_metadata_in_graph(view)
        got, want = vars(on.forward_metadata), vars(off.forward_metadata)
        assert set(want) - set(got) == {f for f in want if f.endswith("kv_indptr_host")}, sorted(set(want) ^ set(got))
        for field, v in got.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, want[field]), (step, mode.name, field)
        planned = [p for p in got.values() if hasattr(p, "batch_size")]
        assert planned and sum(c.calls for c in calls) - sum(before) == len(planned)  # each planned this step
        if name == "tbo_flashinfer":  # each child's planner sees the child's rows
            assert sorted(got[f].batch_size for f in ("tbo0_plan", "tbo1_plan")) == sorted((bs // 2, bs - bs // 2))
        else:
            assert all(p.batch_size == bs for p in planned)
        if twin is not None and raw:
            ref = twin.init_forward_metadata(fb)
            for f in [f for f in vars(ref) if f.endswith("_host") and f not in got]:
                delattr(ref, f)
            assert compare_metadata(on.forward_metadata, ref, fb.seq_lens_cpu) == [], (step, mode.name)
