"""FlashInfer's MLA partition on the device (``backends/flashinfer_mla/device_plan.py``): the Python
transcription of ``MLAPlan`` against cases worked by hand, and the Triton program (in the
interpreter) against the transcription on random batches, decode and causal verify, with splits,
empty rows and both cluster sizes. The GPU tier checks both against FlashInfer's own ``plan()``."""

import random

import pytest
import torch

from attnmeta.backends.flashinfer_mla.device_plan import MERGE, NAMES, WORK, MLADevicePlanner, MLALayout, mla_plan

pytestmark = pytest.mark.overflow_checked  # the kernels' own tests: int32 overflow checked


def test_a_decode_batch_worked_by_hand():
    # 4 SMs, one head: a packed query row per request, so one CTA per cluster and 4 clusters; the
    # limit is 32 (10 keys over 4 clusters). Request 0 takes cluster 0 (the heap's top); popping it
    # moves cluster 2 to the top (libstdc++ sifts the hole down to the right child on a tie), so the
    # empty request 1 takes cluster 2, not cluster 1 as an argmin over costs would say.
    p = mla_plan([0, 1, 2], [0, 10, 10], [10, 0], heads=1, causal=False, num_sm=4)
    assert (p["cluster"], p["clusters"]) == (1, 4)
    assert p["work_indptr"] == [0, 1, 1, 2, 2]
    assert (p["q_indptr"], p["kv_indptr"], p["partial_indptr"]) == ([0, 1], [0, 10], [-1, -1])
    assert (p["q_len"], p["kv_len"], p["q_start"], p["kv_start"], p["kv_end"]) == ([1, 1], [10, 0], [0, 0], [0, 0],
                                                                                  [10, 0])
    assert all(p[k] == [0] * 4 for k in MERGE)


def test_a_split_worked_by_hand():
    # 2 SMs, one head, one request of 100 keys: limit f(50) = 192, no split; with 300 keys the limit is
    # f(150) = 256, so 300 splits into 256 + 44 on two clusters, one merge row for the two partials
    p = mla_plan([0, 1], [0, 300], [300], heads=1, causal=False, num_sm=2)
    assert p["work_indptr"] == [0, 1, 2]
    assert (p["kv_start"], p["kv_end"], p["partial_indptr"]) == ([0, 256], [256, 300], [0, 1])
    assert (p["merge_start"], p["merge_end"], p["merge_partial_start"], p["merge_partial_end"],
            p["merge_partial_stride"]) == ([0, 0], [1, 0], [0, 0], [2, 0], [1, 0])
    assert mla_plan([0, 1], [0, 100], [100], heads=1, causal=False, num_sm=2)["partial_indptr"] == [-1]


def _layout(bs: int, heads: int, causal: bool, num_sm: int, q: int) -> MLALayout:
    cluster = 2 if q * heads > 64 else 1
    offsets, at = [], 0
    for name in NAMES:  # FlashInfer's allocator order; lengths as it sizes them
        offsets.append(at)
        at += 4 * (num_sm if name in MERGE else 4096)
    return MLALayout(bs, heads, causal, cluster, num_sm // cluster, num_sm, tuple(offsets))


def _device(plan_in, L: MLALayout, q: int) -> torch.Tensor:
    qo, kv, lens = (torch.tensor(x, dtype=torch.int32) for x in plan_in)
    ws = torch.full((L.offsets[-1] + 4 * 4096,), 0xAB, dtype=torch.uint8)  # stale bytes, as a reused workspace
    MLADevicePlanner(L, qo, kv, lens, ws, q)()
    return ws.view(torch.int32)


@pytest.mark.parametrize("heads,q,causal,num_sm", [(128, 1, False, 132), (16, 1, False, 20), (128, 4, True, 132),
                                                   (16, 2, True, 9), (1, 1, False, 7)],
                         ids=["deepseek-decode", "small-decode", "deepseek-verify", "odd-clusters", "one-head"])
def test_the_kernel_plans_as_the_transcription(heads, q, causal, num_sm):
    rng = random.Random(heads * 7 + q)
    for step in range(3):
        bs = rng.choice([1, 2, 5, 13])
        lens = [rng.choice([0 if not causal else q, q, 63, 64, 65, 3000]) if rng.random() < 0.4 else
                rng.randint(q, 4000) for _ in range(bs)]
        qo = [i * q for i in range(bs + 1)]
        kv = [0, *torch.tensor(lens).cumsum(0).tolist()]
        want = mla_plan(qo, kv, lens, heads, causal, num_sm)
        L = _layout(bs, heads, causal, num_sm, q)
        assert (L.cluster, L.clusters) == (want["cluster"], want["clusters"])
        words = _device((qo, kv, lens), L, q)
        live = want["work_indptr"][-1]
        got = {n: words[L.at(n):L.at(n) + (L.clusters + 1 if n == "work_indptr" else num_sm if n in MERGE else live)]
               .tolist() for n in NAMES}
        for n in (*WORK, *MERGE, "work_indptr"):
            assert got[n] == want[n], (step, n, bs, lens)


def test_a_layout_from_plan_info_it_does_not_know_is_refused():
    info = [2, 66, *range(0, 14 * 64, 64), 0, 0]
    assert MLALayout.of(info, 8, 128, False, 132) is not None
    assert MLALayout.of(info[:17], 8, 128, False, 132) is None  # another FlashInfer's plan info
    assert MLALayout.of([2, 60, *info[2:]], 8, 128, False, 132) is None  # a grid not sized by the SMs
    assert MLALayout.of([2, 66, 2, *info[3:]], 8, 128, False, 132) is None  # an offset off a word


class _PlanningMLAWrapper:
    """FlashInfer 0.6's graph-mode MLA wrapper as far as its plan goes, on the CPU: ``plan()`` and the
    compiled module's C++ planner write ``mla_plan`` (the transcription) into the int workspace at the
    offsets FlashInfer's allocator gives, and return its 18-entry plan info. ``skew`` makes its
    planner disagree with the device planner (one more unit of cost per item)."""

    skew = False

    def __init__(self, workspace, use_cuda_graph=False, qo_indptr=None, kv_indptr=None, kv_indices=None,
                 kv_len_arr=None, backend="auto"):
        self._float_workspace_buffer = workspace
        self._int_workspace_buffer = torch.zeros(4 * (14 * 4096 + 8), dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = self._int_workspace_buffer
        self._kv_indices_buf = kv_indices
        self.host_plans = 0

    def plan(self, qo, kv, indices, lens, heads, ckv, kpe, page_size, causal, sm_scale, q_dtype, kv_dtype):
        w = self

        class Module:
            def plan(self, fws, iws, pws, qo, kv, lens, heads, ckv, causal):
                w.host_plans += 1
                return w._write(qo.tolist(), kv.tolist(), lens.tolist(), heads, causal)
        self._cached_module = Module()
        self._plan_info = self._cached_module.plan(None, None, None, qo, kv, lens, heads, ckv, causal)

    def _write(self, qo, kv, lens, heads, causal):
        p = mla_plan(qo, kv, [x + self.skew for x in lens], heads, causal, SMS)
        L = _layout(len(lens), heads, causal, SMS, 1)
        words = self._int_workspace_buffer.view(torch.int32)
        for n in NAMES:
            words[L.at(n):L.at(n) + len(p[n])] = torch.tensor(p[n], dtype=torch.int32)
        return [p["cluster"], p["clusters"], *L.offsets, 0, 0]


SMS = 12


@pytest.mark.parametrize("skew", [False, True], ids=["agrees", "disagrees"])
def test_the_adapter_plans_on_the_device_once_checked_else_on_the_host(monkeypatch, skew):
    """``partition="device"``: the site's first step runs FlashInfer's plan(), checks the device planner
    against FlashInfer's planner on synthetic batches and this one, then hands every later step to
    the kernel after the graph (FlashInfer's planner not called again, the workspace what it would
    have written). A planner that disagrees keeps FlashInfer's host planner, every step."""
    import sys
    import types

    from attnmeta.backends.flashinfer_mla.planner import FlashInferMLAAdapter
    from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
    from attnmeta.runtime import ForwardBatch, ReplayView
    from tests.batches import make_pool

    wrapper = type("W", (_PlanningMLAWrapper,), {"skew": skew})
    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(__version__="0.6.4",
                                                                         BatchMLAPagedAttentionWrapper=wrapper))
    L, heads = 512, 16
    be = compile_backend("flashinfer_mla", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L,
                                                          modes=("decode",), sm_count=SMS, num_heads=heads)
                         ).instantiate(make_pool(9, L, seed=1))
    FlashInferMLAAdapter(be, heads, 512, 64, workspace=torch.empty(8, dtype=torch.uint8), partition="device")
    rng = random.Random(2)
    for step in range(6):
        raw = rng.randint(1, 4)
        seq = torch.tensor([rng.choice([1, 300, L]) for _ in range(raw)], dtype=torch.int32)
        rows = torch.tensor(rng.sample(range(1, 9), raw))
        fb = ForwardBatch(ForwardMode.DECODE, raw, req_pool_indices=rows, req_pool_indices_cpu=rows, seq_lens=seq,
                          seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        view = ReplayView.of(fb, 4)
        be.init_forward_metadata_out_graph(view)
        be.init_forward_metadata_in_graph(view)
        site = be.bound(ForwardMode.DECODE, 4).sites["plan"]
        w = site.state.wrapper
        assert (site.state.device is None) == skew
        lens = [*seq.tolist(), *[1] * (4 - raw)]  # padded rows: the fill length
        want = mla_plan(list(range(5)), [0, *torch.tensor(lens).cumsum(0).tolist()], [x + skew for x in lens], heads,
                        False, SMS)
        layout = _layout(4, heads, False, SMS, 1)
        words = w._int_workspace_buffer.view(torch.int32)
        for n in (*WORK, *MERGE, "work_indptr"):
            got = words[layout.at(n):layout.at(n) + len(want[n])].tolist()
            assert got == want[n], (step, n)
    # the first step's plan() and its four checks, then no host planner at all (or one per step)
    assert w.host_plans == (5 + 5 if skew else 5)
