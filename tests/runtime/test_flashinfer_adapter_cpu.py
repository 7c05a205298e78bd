"""The FlashInfer adapter's planning logic on the CPU, against a stand-in FlashInfer whose planners are
the transcribed ones (``tests/fake_flashinfer.py``): a backend compiled with every mode FlashInfer
serves, modes and sizes interleaved step by step, the partition of every step planned by the device
planner after the metadata graph (the Triton kernel in its interpreter) and compared, word for word on
what the kernels read, with FlashInfer's plan of that step; compiled with ``plan_on_device`` too; and
a FlashInfer whose planner the device planner does not repeat: a host planner every step, or, with
nothing on the host to plan from, a clear error."""

import random
import sys

import pytest
import torch

from attnmeta.backends.flashinfer import planner as fa
from attnmeta.backends.flashinfer.device_plan import PlanLayout, live_regions
from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.backends.reference import PlanError
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView
from tests import fake_flashinfer
from tests import flashinfer_plan_oracle as oracle
from tests.batches import make_pool
from tests.runtime.test_stagegen import MAX_BS, ROWS, D
from tests.runtime.test_stagegen import batch as short_batch

M = ForwardMode
L = 16384  # long enough that the chunk search meets its CTA bound in both planners
MODES = (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND)
HEADS = (8, 2, 128)


def backend(plan_on_device: bool, bug: bool, tensor_cores: bool, monkeypatch, version: str = "0.6.4"):
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module(bug, version))
    monkeypatch.setattr(fa, "lean_planner", lambda *a: None)  # the stand-in has no C++ module: plan() each step
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(4, MAX_BS), max_context_len=L, num_draft_tokens=D,
                          modes=("decode", "idle", "target_verify", "draft_extend"),
                          backend=FlashInferOptions(plan_on_device=plan_on_device))
    be = compile_backend("flashinfer", opts).instantiate(make_pool(ROWS, L, 1))
    return be, fa.FlashInferDecodeAdapter(be, *HEADS, use_tensor_cores=tensor_cores, workspace_bytes=1 << 10)


def batch(mode, raw: int, rng: random.Random):
    """A batch of ``short_batch``'s shape whose sequences reach the context length."""
    fb = short_batch(mode, raw, rng)
    seq = torch.tensor([rng.choice([1, 127, 128, 129, L - D]) if rng.random() < 0.4 else rng.randint(1, L - D)
                        for _ in range(raw)], dtype=torch.int32)
    fb.seq_lens, fb.seq_lens_cpu, fb.seq_lens_sum = seq, seq.clone(), int(seq.sum())
    return fb


def flashinfer_plan(mode, meta, bs: int, tensor_cores: bool, bug: bool):
    """FlashInfer's plan of this step, from the kv indptr the metadata graph wrote."""
    kv = meta.kv_indptr[: bs + 1].tolist()
    chunk = 64 if bug else 128
    if mode is M.DECODE and not tensor_cores:
        return oracle.decode_plan(kv, fake_flashinfer.MAX_GRID, HEADS[1], 1, fake_flashinfer.WS, chunk)[:2]
    qo = meta.qo_indptr[: bs + 1].tolist() if mode is not M.DECODE else list(range(bs + 1))
    return oracle.prefill_plan(qo, kv, fake_flashinfer.SMS, HEADS[:2], HEADS[2], 1, fake_flashinfer.WS, chunk)[:2]


@pytest.mark.parametrize("plan_on_device", [False, True], ids=["default", "plan_on_device"])
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["tensor-cores", "cuda-cores"])
def test_every_step_is_partitioned_as_flashinfer_plans_it(plan_on_device, tensor_cores, monkeypatch):
    be, adapter = backend(plan_on_device, False, tensor_cores, monkeypatch)
    rng = random.Random(f"{plan_on_device}{tensor_cores}")
    for step in range(8):
        mode, raw = MODES[step % 3] if step < 3 else rng.choice(MODES), rng.randint(1, MAX_BS)
        bs = 4 if raw <= 4 else MAX_BS
        view = ReplayView.of(batch(mode, raw, rng), bs)
        be.init_forward_metadata_out_graph(view)
        be.init_forward_metadata_in_graph(view)  # the metadata graph, then the partition after it
        m = be.forward_metadata
        w = m.plan
        device = adapter.site_of(w).state.device
        assert device is not None, (step, mode.name)
        info, want = flashinfer_plan(mode, m, bs, tensor_cores or mode is not M.DECODE, False)
        assert list(w._plan_info) == info  # graph mode: what the first plan() fixed holds for every step
        layout = device.layout
        for at, n in live_regions(layout, torch.from_numpy(want)):
            assert w._int_workspace_buffer[at : at + n].tolist() == want[at : at + n].tolist(), (step, mode.name, at)
    assert len(adapter.wrappers) == len({(k[0], k[1]) for k in adapter.wrappers})  # one wrapper per mode and size


def test_a_planner_it_does_not_repeat_keeps_flashinfer_planning_on_the_host(monkeypatch, caplog):
    be, adapter = backend(False, True, True, monkeypatch)
    rng = random.Random(2)
    for step in range(6):
        mode, raw = MODES[step % 3], rng.randint(1, MAX_BS)
        bs = 4 if raw <= 4 else MAX_BS
        view = ReplayView.of(batch(mode, raw, rng), bs)
        be.init_forward_metadata_out_graph(view)
        be.init_forward_metadata_in_graph(view)
        m = be.forward_metadata
        assert adapter.site_of(m.plan).state.device is None and not be._current.after_in[1:]  # no partition kernel
        info, want = flashinfer_plan(mode, m, bs, True, True)
        layout = (PlanLayout.prefill_plan(info, bs, HEADS[:2], 1, fake_flashinfer.SMS))
        for at, n in live_regions(layout, torch.from_numpy(want)):  # planned on the host, this very step
            assert m.plan._int_workspace_buffer[at : at + n].tolist() == want[at : at + n].tolist(), step
    assert "does not match FlashInfer's" in caplog.text


def test_plan_on_device_without_a_device_planner_is_an_error(monkeypatch):
    be, _ = backend(True, True, True, monkeypatch)
    view = ReplayView.of(batch(M.DECODE, 3, random.Random(0)), 4)
    with pytest.raises(PlanError, match="compiled with plan_on_device.*compile without --plan-on-device"):
        be.init_forward_metadata_out_graph(view)


def test_plan_on_device_with_a_flashinfer_it_does_not_know_is_an_error(monkeypatch):
    be, _ = backend(True, False, False, monkeypatch, version="0.7.0")
    view = ReplayView.of(batch(M.DECODE, 3, random.Random(0)), 4)
    with pytest.raises(PlanError, match=r"does not repeat FlashInfer 0\.7\.0's decode planner .*repeats 0\.6"):
        be.init_forward_metadata_out_graph(view)


@pytest.mark.parametrize("name", ["tbo_flashinfer", "multistep_flashinfer"])
@pytest.mark.parametrize("plan_on_device", [False, True], ids=["default", "plan_on_device"])
def test_wrapped_backends_partition_each_wrapper_from_its_own_indptr(name, plan_on_device, monkeypatch):
    """TBO's batch and halves, the drafter's steps: one wrapper per planner node, each partitioned
    after the metadata graph from its own kv indptr (a TBO half of no rows is left unplanned)."""
    monkeypatch.setitem(sys.modules, "flashinfer", fake_flashinfer.module())
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(1, 4, MAX_BS), max_context_len=L, modes=("decode", "idle"),
                          backend=FlashInferOptions(plan_on_device=plan_on_device))
    be = compile_backend(name, opts).instantiate(make_pool(ROWS, L, 1))
    fa.FlashInferDecodeAdapter(be, *HEADS, use_tensor_cores=True, workspace_bytes=1 << 10)
    rng = random.Random(name)
    for step, raw in enumerate([1, 7, 3, 8, 1]):
        bs = 1 if raw == 1 else 4 if raw <= 4 else MAX_BS
        view = ReplayView.of(batch(M.DECODE, raw, rng), bs)
        be.init_forward_metadata_out_graph(view)
        be.init_forward_metadata_in_graph(view)
        m = vars(be.forward_metadata)
        sites = be.bound(M.DECODE, bs).sites  # one per planner node, each on its own step's or half's fields
        assert len(sites) == 3, sites
        for key, site in sites.items():
            indptr = site.field("kv_indptr")
            assert indptr.data_ptr() == m[key.removesuffix("plan") + "kv_indptr"].data_ptr()  # its own fields
            rows = indptr.numel() - 1
            w = site.state.wrapper
            assert m[key] is w
            if rows == 0:  # the empty half of a batch of one
                assert site.state.device is None
                continue
            assert site.state.device is not None, (step, key)
            info, want, _ = oracle.prefill_plan(list(range(rows + 1)), indptr.tolist(), fake_flashinfer.SMS,
                                                HEADS[:2], HEADS[2], 1, fake_flashinfer.WS)
            for at, n in live_regions(site.state.device.layout, torch.from_numpy(want)):
                assert w._int_workspace_buffer[at : at + n].tolist() == want[at : at + n].tolist(), (step, key)
