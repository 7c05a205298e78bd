"""Every backend x page size x captured size: compiled eager == capture ==
replay == eager twin == interpreter, with padded sizes, IDLE, and replays
unlike the capture (short context captured, long context replayed)."""

from types import SimpleNamespace

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.runtime import ForwardBatch, ReplayView
from attnmeta.runtime.planning import PlanError
from tests.batches import capture, interp_inputs, make_batch, make_pool
from tests.oracles import assert_metadata_equal, padded

pytestmark = pytest.mark.overflow_checked  # the kernels' own tests: int32 overflow checked

L, ROWS, MAX_BS, SIZES = 128, 20, 10, (1, 4, 8)
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}
CASES = [("flashinfer", 1), ("triton", 1), ("flashattention", 1), ("flashattention", 16), ("flashattention", 64)]


def twin(name, pool, page_size):
    cls = get_eager(name)
    return cls(pool, MAX_BS, page_size) if name == "flashattention" else cls(pool, MAX_BS)


def check(name, cb, be, fb, bs, pool, page_size):
    full = padded(fb, bs)
    assert_metadata_equal(be.forward_metadata, twin(name, pool, page_size).init_forward_metadata(full),
                          full.seq_lens_cpu, page_size)
    want = eval_graph(cb.plan(ForwardMode.DECODE, bs).graph, interp_inputs(fb, bs, pool, FILLS))
    for field, w in want.items():
        if isinstance(w, torch.Tensor) and field != "kv_indices":
            assert torch.equal(getattr(be.forward_metadata, field).cpu(), w), field


@pytest.mark.parametrize("name,page_size", CASES)
def test_capture_and_replay_match_the_twin(name, page_size):
    cb = compile_backend(name, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                              page_size=page_size))
    pool = make_pool(ROWS, L, seed=page_size)
    for bs in SIZES:
        be = cb.instantiate(pool)
        cap = make_batch(bs, L, ROWS, seed=bs, max_len=4)  # short context at capture
        g = capture(be, cap)
        check(name, cb, be, cap, bs, pool, page_size)
        for seed, raw in [(11, bs), (12, bs - 1), (13, 0)]:  # long context, padding, IDLE
            fb = make_batch(raw, L, ROWS, seed=seed) if raw else ForwardBatch(ForwardMode.IDLE, 0)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            check(name, cb, be, fb, bs, pool, page_size)


@pytest.mark.parametrize("name,page_size", CASES)
def test_eager_any_size_matches_the_twin(name, page_size):
    cb = compile_backend(name, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                              page_size=page_size))
    pool = make_pool(ROWS, L, seed=3)
    be = cb.instantiate(pool)
    for raw in (1, 3, 9, 10):
        fb = make_batch(raw, L, ROWS, seed=raw)
        be.init_forward_metadata(fb)
        check(name, cb, be, fb, raw, pool, page_size)


def test_triton_splits_follow_the_replayed_batch_not_the_capture():
    """Bug class 6: the split partition is recomputed on device every replay."""
    cb = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    pool = make_pool(ROWS, L, seed=0)
    be = cb.instantiate(pool)
    cap = make_batch(4, L, ROWS, seed=0, max_len=2)
    g = capture(be, cap)
    captured = be.forward_metadata.num_kv_splits.clone()
    fb = make_batch(4, L, ROWS, seed=0)
    fb.seq_lens_cpu[:] = torch.tensor([1, 2, 100, 128], dtype=torch.int32)
    fb.seq_lens = fb.seq_lens_cpu.clone()
    be.init_forward_metadata_out_graph(ReplayView.of(fb, 4))
    g.replay()
    # max 128, min 1: 8 splits of 16 tokens -> ceil(seq / 16)
    assert be.forward_metadata.num_kv_splits.tolist() == [1, 1, 7, 8]
    assert not torch.equal(be.forward_metadata.num_kv_splits, captured)


def test_flashattention_page_table_hand_computed():
    cb = compile_backend("flashattention", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=8,
                                                         page_size=4))
    pool = torch.zeros(3, 8, dtype=torch.int32)
    pool[1] = torch.tensor([40, 41, 42, 43, 12, 13, 14, 15], dtype=torch.int32)  # pages 10 and 3
    pool[2] = torch.tensor([20, 21, 22, 23, 0, 0, 0, 0], dtype=torch.int32)  # page 5
    be = cb.instantiate(pool)
    seq = torch.tensor([6, 3], dtype=torch.int32)
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=torch.tensor([1, 2]),
                                          seq_lens=seq, seq_lens_cpu=seq.clone()))
    m = be.forward_metadata
    assert m.page_table.tolist() == [[10, 3], [5, 0]]
    assert m.cu_seqlens_k.tolist() == [0, 6, 9] and m.cu_seqlens_q.tolist() == [0, 1, 2]
    assert int(m.max_seq_len_q) == 1 and int(m.max_seq_len_k) == 8


@pytest.mark.parametrize("seqs,sms,splits", [
    # one SM: the SM-count term asks for one split, so the length term alone decides
    ([100, 85, 100, 90], 1, [1, 1, 1, 1]),  # within 25 %: min := max, one split each
    ([100, 70, 100, 90], 1, [2, 2, 2, 2]),  # ceil(100/70) = 2 splits of 50
    ([128, 1, 64, 16], 1, [8, 1, 4, 1]),  # capped at 8 splits of 16
    # an H200 (132 SMs), 32 query heads over 8 KV heads: 8 blocks per request, a grid of 32 for 4
    # requests; cores = int(132 * max(log2(100/64), 1)) = 132 -> ceil(132/32) = 5 splits of 20
    ([100, 85, 100, 90], 132, [5, 5, 5, 5]),
    # one request of 256: cores = int(132 * log2(4)) = 264, grid 8 -> min(33, 8) = 8 splits of 32
    ([256], 132, [8]),
])
def test_triton_split_heuristic_hand_computed(seqs, sms, splits):
    bs = len(seqs)
    cb = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(bs,), max_context_len=256, sm_count=sms))
    be = cb.instantiate(make_pool(ROWS, 256, seed=0))
    seq = torch.tensor(seqs, dtype=torch.int32)
    fb = ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=torch.arange(1, bs + 1), seq_lens=seq,
                      seq_lens_cpu=seq.clone())
    be.init_forward_metadata(fb)
    assert be.forward_metadata.num_kv_splits.tolist() == splits
    twin = get_eager("triton")(make_pool(ROWS, 256), 4, sm_count=sms)
    assert twin.init_forward_metadata(fb).num_kv_splits.tolist() == splits


@pytest.mark.parametrize("page_size", [1, 16])
def test_flashattention_draft_steps_match_the_twin(page_size):
    cb = compile_backend("flashattention_draft", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                               page_size=page_size, num_steps=3))
    pool = make_pool(ROWS, L, seed=7)
    twin = get_eager("flashattention_draft")(pool, MAX_BS, page_size, num_steps=3)
    for bs in SIZES:
        be = cb.instantiate(pool)
        g = capture(be, make_batch(bs, L, ROWS, seed=bs, max_len=4))
        for seed, raw in [(31, bs), (32, bs - 1)]:
            fb = make_batch(raw, L, ROWS, seed=seed, max_len=L - 3)  # room for the 3 drafted tokens
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            full = padded(fb, bs)
            ref = twin.init_forward_metadata(full)
            for i in range(3):  # each step's fields, compared as one step's metadata
                keys = [k for k in vars(ref) if k.startswith(f"step{i}_")]
                want = SimpleNamespace(**{k.split("_", 1)[1]: getattr(ref, k) for k in keys})
                got = SimpleNamespace(**{k.split("_", 1)[1]: getattr(be.forward_metadata, k) for k in keys})
                assert_metadata_equal(got, want, full.seq_lens_cpu + i + 1, page_size)
            assert torch.equal(be.forward_metadata.cu_seqlens_q, ref.cu_seqlens_q)


def test_a_planner_of_the_engine_gets_its_site_and_the_host_tensors():
    """An engine's own plan() is called planner(site, *host inputs): the site carries the fields the
    spec binds (by role, the static buffers) and a state dict of its own. One written without the
    site is refused when the plan is bound, naming the protocol."""
    seen = []

    def plan(site, indptr_host, last_page_len_host):
        seen.append((site.node, site.bs, sorted(site.fields), indptr_host.tolist()))
        site.state["calls"] = site.state.get("calls", 0) + 1
        return "planned"

    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    be = cb.instantiate(make_pool(ROWS, L, seed=1), planners={"flashinfer.decode_plan": plan})
    fb = make_batch(2, L, ROWS, seed=3)
    be.init_forward_metadata(fb)
    assert be.forward_metadata.plan == "planned"
    node, bs, roles, indptr = seen[-1]
    assert (node, bs, roles) == ("plan", 2, ["kv_indices", "kv_indptr", "kv_last_page_len"])
    assert indptr == [0, *torch.cumsum(fb.seq_lens_cpu, 0).tolist()]  # the host indptr, from the host mirror
    site = be.bound(fb.forward_mode, 2).sites["plan"]
    assert site.fields["kv_indptr"].data_ptr() == be.forward_metadata.kv_indptr.data_ptr()  # the field's buffer
    assert site.state["calls"] == 1

    def old_style(indptr_host, last_page_len_host):
        return "planned"

    be2 = cb.instantiate(make_pool(ROWS, L, seed=1), planners={"flashinfer.decode_plan": old_style})
    with pytest.raises(PlanError, match=r"cannot be called planner\(site, \*inputs\) with the 2 host inputs"):
        be2.init_forward_metadata(fb)

