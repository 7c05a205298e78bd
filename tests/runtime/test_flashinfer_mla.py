"""FlashInfer MLA: a spec plus a planner class. The compiled metadata is checked against the
interpreter and the eager twin in tests/engine.py (every mode interleaved); here the planner:
one graph-mode MLA wrapper per site, on the fields the spec binds, planned from host arrays equal
to the eager twin's (SGLang's way: query indptr, kv indptr, kv lengths), FlashInfer's full plan()
once per site and its C++ planner alone after, causal everywhere but decode. FlashInfer is the
CPU stand-in of tests/fake_flashinfer.py."""

import random
import sys

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.backends.flashinfer_mla.planner import MLA_PLANNER, FlashInferMLAAdapter, ReferenceMLAPlanner
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView
from attnmeta.runtime.planning import PlanError, Site
from attnmeta.sim.compare import padded
from tests import fake_flashinfer
from tests.batches import make_pool
from tests.engine import batch, build

M = ForwardMode
MODES = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND, M.IDLE)
HEADS, CKV = 16, 512


def test_the_mla_wrapper_plans_each_step_from_the_eager_twins_host_arrays(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    eng = build("flashinfer_mla", max_bs=8, sizes=(2, 4, 8))  # its batches; a backend of our own, planned by
    be = eng.cb.instantiate(eng.pool)  # the adapter before anything is captured
    adapter = FlashInferMLAAdapter(be, HEADS, CKV, 64, workspace=torch.empty(8, dtype=torch.uint8))
    twin = get_eager("flashinfer_mla")(eng.pool, 8, draft_tokens=eng.opts.num_draft_tokens)
    rng = random.Random(5)
    for step in range(24):
        mode = MODES[step % 4] if step < 4 else rng.choice(MODES)
        raw = 0 if mode is M.IDLE else rng.randint(1, 8)
        bs = next(s for s in (2, 4, 8) if s >= max(raw, 1))
        fb = batch(eng, mode, raw, rng)
        view = ReplayView.of(fb, bs) if mode is not M.IDLE else ReplayView(bs, M.IDLE, M.IDLE, 0)
        be.init_forward_metadata_out_graph(view)
        be.init_forward_metadata_in_graph(view)
        m = be.forward_metadata
        site = be.bound(mode, bs).sites["plan"]
        w = m.plan
        assert w is site.state.wrapper and w in [s.state.wrapper for s in adapter.sites]
        for buf, field in ((w._qo_indptr_buf, m.qo_indptr), (w._kv_indptr_buf, m.kv_indptr),
                           (w._kv_indices_buf, m.kv_indices), (w._kv_len_arr_buf, m.kv_lens)):
            assert buf.data_ptr() == field.data_ptr()  # the wrapper reads the compiled fields themselves
        want = twin.init_forward_metadata(padded(fb, bs, M.DECODE if mode is M.IDLE else mode))
        qo, kv, lens, heads, ckv, causal = w.plans[-1]
        assert (qo, kv, lens) == (want.qo_indptr_host.tolist(), want.kv_indptr_host.tolist(),
                                  want.kv_lens_host.tolist()), (step, mode)
        assert (heads, ckv, causal) == (HEADS, CKV, not mode.is_decode_or_idle())
    assert all(s.state.wrapper.full_plans == 1 for s in adapter.sites)  # plan() once, then the C++ planner
    assert sum(len(s.state.wrapper.plans) for s in adapter.sites) == 24  # every step planned once


def test_the_stand_in_refuses_what_flashinfer_would():
    p = ReferenceMLAPlanner()
    site = Site.detached(MLA_PLANNER, M.DECODE, 2)
    qo, kv = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 3, 5], dtype=torch.int32)
    assert p(site, qo, kv, torch.tensor([3, 2], dtype=torch.int32)).total_kv == 5
    with pytest.raises(PlanError, match="the kv lengths disagree with the kv indptr"):
        p(site, qo, kv, torch.tensor([3, 3], dtype=torch.int32))
    with pytest.raises(PlanError, match="need 3 entries for 2 kv lengths"):
        p(site, qo[:2], kv, torch.tensor([3, 2], dtype=torch.int32))
    with pytest.raises(PlanError, match="plan\\(\\) needs kv_indptr on the host"):
        p(site, qo, kv.to("meta"), torch.tensor([3, 2], dtype=torch.int32))


def test_the_spec_plans_on_its_stand_in_without_flashinfer():
    """Compiled and served with no FlashInfer: the spec's stand-in plans each step in place."""
    L, rows = 64, 9
    cb = compile_backend("flashinfer_mla", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    be = cb.instantiate(make_pool(rows, L))
    assert isinstance(be.planners[MLA_PLANNER], ReferenceMLAPlanner)
    fb = batch(build("flashinfer_mla", max_bs=4, sizes=(4,), L=L, rows=rows), M.DECODE, 3, random.Random(1))
    be.init_forward_metadata(ReplayView.of(fb, 4))
    assert be.forward_metadata.plan.total_kv == int(fb.seq_lens_cpu.sum()) + 1  # + the padded row's token
