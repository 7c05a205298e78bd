"""MultiStep (S draft steps, topk K) around FlashInfer and Triton: every
step's metadata == the eager multi-step twin (inner twin per step, the
drafter's branch layout for K > 1), through capture and replay; the branch
layout against hand-computed indices; an IDLE batch inside the wrapper stays
IDLE; sequences without room for the drafts are refused."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, OptionsError, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.runtime import BatchError, ForwardBatch, ReplayView
from tests.batches import capture, interp_inputs, make_batch, make_pool
from tests.oracles import assert_metadata_equal, padded

L, ROWS, MAX_BS, SIZES, S = 48, 12, 8, (1, 4, 8), 3
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}


@pytest.mark.parametrize("inner", ["flashinfer", "triton"])
@pytest.mark.parametrize(("topk", "page"), [(1, 1), (2, 1), (3, 16)])
def test_every_step_matches_the_twin(inner, topk, page):
    name, L = f"multistep_{inner}", 48 if page == 1 else 128
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, num_steps=S, topk=topk,
                          page_size=page)
    cb = compile_backend(name, opts)
    pool = make_pool(ROWS, L, seed=2)
    twin = get_eager(name)(pool, MAX_BS, num_steps=S, topk=topk, page_size=page)
    assert all(r["kernels"] == "1" for r in cb.summary())  # every step's metadata, every branch: one kernel
    room = L - cb.spec.headroom(ForwardMode.DECODE, opts)
    for bs in SIZES:
        be = cb.instantiate(pool)
        g = capture(be, make_batch(bs, L, ROWS, seed=bs, max_len=3))
        for seed, raw in [(41, bs), (42, bs - 1)]:
            fb = make_batch(raw, L, ROWS, seed=seed, max_len=room)  # room for every branch's drafts
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            full = padded(fb, bs)
            assert_metadata_equal(be.forward_metadata, twin.init_forward_metadata(full), full.seq_lens_cpu)
            want = eval_graph(cb.plan(ForwardMode.DECODE, bs).graph, interp_inputs(fb, bs, pool, FILLS))
            for field, w in want.items():  # the reference interpreter, padded rows included
                if isinstance(w, torch.Tensor):
                    got = torch.as_tensor(getattr(be.forward_metadata, field)).cpu()
                    if "kv_indices" in field:  # defined up to the indptr's end
                        n = int(want[field.replace("kv_indices", "kv_indptr")][-1])
                        got, w = got[:n], w[:n]
                    assert torch.equal(got, w), field


@pytest.mark.parametrize(("page", "want"), [
    # P 1, S 2: branch k's drafts at seq + k*S. Request 0 (pool row 1, 3 tokens), request 1 (row 2, 5).
    (1, [100, 101, 102, 103, 100, 101, 102, 105, 200, 201, 202, 203, 204, 205, 200, 201, 202, 203, 204, 207]),
    # P 4: each branch owns ceil((seq%P + S)/P) pages, its drafts at the prefix's page offset.
    # seq 3: offset 3 + 2 drafts span 2 pages, so branch 1 starts at 0 + 8 + 3 = 11; seq 5: 4 + 4 + 1 = 9
    (4, [100, 101, 102, 103, 100, 101, 102, 111, 200, 201, 202, 203, 204, 205, 200, 201, 202, 203, 204, 209]),
])
def test_branch_layout_by_hand(page, want):
    """Step 0 of topk 2: rows z = b*K + k over the prefix, then the branch's first drafted slot."""
    L = 16
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=L,
                                                               num_steps=2, topk=2, page_size=page))
    pool = (torch.arange(3)[:, None] * 100 + torch.arange(L)).to(torch.int32)  # row r, column c: 100r + c
    be = cb.instantiate(pool)
    seq = torch.tensor([3, 5], dtype=torch.int32)
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=torch.tensor([1, 2]),
                                          seq_lens=seq, seq_lens_cpu=seq))
    m = be.forward_metadata
    assert m.step0_kv_indptr.tolist() == [0, 4, 8, 14, 20]
    assert m.step0_kv_indices[:20].tolist() == want
    assert m.step0_kv_indptr_host.tolist() == [0, 4, 8, 14, 20]  # the planner's, from the host mirror
    assert m.step1_kv_indptr.tolist() == [0, 5, 10, 17, 24]
    # a step's fields reached by index: the same tensors, live (the planner's result set every step too)
    assert m.step(1).kv_indptr is m.step1_kv_indptr and m.step(0).plan is m.step0_plan
    assert "kv_indices" in m.step(0).fields() and not any(f.startswith("step") for f in m.step(0).fields())
    with pytest.raises(AttributeError, match="no field step2_kv_indptr"):
        m.step(2).kv_indptr  # noqa: B018 - a step the drafter does not have


@pytest.mark.parametrize("topk", [1, 2])
def test_idle_inside_the_wrapper_is_not_run_as_decode(topk):
    """The replay after a real batch is IDLE: every step must see only fill rows (length 1 + s + 1
    in pool row 0, per branch), not the previous batch's requests."""
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L,
                                                               num_steps=S, topk=topk))
    pool = make_pool(ROWS, L, seed=3)
    be = cb.instantiate(pool)
    g = capture(be, make_batch(4, L, ROWS, seed=1))
    be.init_forward_metadata_out_graph(ReplayView.of(make_batch(4, L, ROWS, seed=9, max_len=L - 2 * S), 4))
    g.replay()
    be.init_forward_metadata_out_graph(ReplayView.of(ForwardBatch(ForwardMode.IDLE, 0), 4))
    g.replay()
    m, rows = be.forward_metadata, 4 * topk
    for s in range(S):
        lens = 1 + s + 1
        assert getattr(m, f"step{s}_kv_indptr").tolist() == [lens * r for r in range(rows + 1)]
        assert not bool(getattr(m, f"step{s}_kv_indices")[: rows * lens].any())  # pool row 0: all zero
        assert getattr(m, f"step{s}_plan").batch_size == rows


def test_a_sequence_without_room_for_the_drafts_is_refused():
    """topk 2, S 3: the last branch drafts into columns seq + 3 .. seq + 5, so seq may be at most L - 6."""
    cb = compile_backend("multistep_triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L,
                                                           num_steps=S, topk=2))
    be = cb.instantiate(make_pool(ROWS, L, seed=3))
    fb = make_batch(2, L, ROWS, seed=0, max_len=4)
    fb.seq_lens_cpu[1] = L - 5
    want = rf"{L - 5} tokens exceeds {L - 6}, .*max_context_len={L} less the 6 slots decode reads"
    with pytest.raises(BatchError, match=want):
        be.init_forward_metadata(fb)
    fb.seq_lens_cpu[1] = L - 6
    be.init_forward_metadata(fb)


def test_drafts_that_cannot_fit_the_context_are_refused_at_compile_time():
    with pytest.raises(OptionsError, match="reads 67 request-table columns .*max_context_len=64.*above 67"):
        compile_backend("multistep_flashinfer", CompileOptions(max_bs=4, max_context_len=64, topk=3, page_size=16))


def test_draft_window_by_hand():
    """A draft window W 3 with a sink S 2 (the drafter's keys: its prefix's first 2 tokens and last 3, then its
    drafts), 3 steps, page 1. Pool row r holds 100 r + c at column c. Request A (row 1) has 10 tokens: 100, 101
    (the sink), 107..109 (the window), then its drafts from column 10. B (row 2) has 4, fewer than W + S: all of
    them. With topk 2 each branch's drafts start at seq + 3 k (A's branch 1 at column 13, B's at 7), after the same
    kept prefix; the window is the drafter's own, not a window of the model's."""
    from attnmeta.backends.triton.spec import TritonOptions

    pool = torch.zeros(3, 32, dtype=torch.int32)
    pool[1], pool[2] = torch.arange(100, 132, dtype=torch.int32), torch.arange(200, 232, dtype=torch.int32)
    seq, rpi = torch.tensor([10, 4], dtype=torch.int32), torch.tensor([1, 2])
    a = [100, 101, 107, 108, 109]
    want = {1: [a + [110], list(range(200, 205))], 2: [a + [110], a + [113], list(range(200, 205)),
                                                         [200, 201, 202, 203, 207]]}
    for K, rows in want.items():
        cb = compile_backend("multistep_triton", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=32,
                                                               topk=K, num_steps=3,
                                                               backend=TritonOptions(draft_window=3, draft_sink=2)))
        be = cb.instantiate(pool)
        be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                              seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=14))
        m = be.forward_metadata
        for s in range(3):  # step s: each row's kept prefix and its first s + 1 drafts
            got = [m.step(s).kv_indices[int(m.step(s).kv_indptr[i]): int(m.step(s).kv_indptr[i + 1])].tolist()
                   for i in range(2 * K)]
            assert got == [r[:-1] + [r[-1] + t for t in range(s + 1)] for r in rows], (K, s, got)


def test_a_draft_window_outside_the_drafter_or_a_sink_alone_is_refused():
    from attnmeta.backends.triton.spec import TritonOptions

    with pytest.raises(OptionsError, match="draft_sink=4 needs a draft window"):
        TritonOptions(draft_sink=4)
    with pytest.raises(OptionsError, match="draft_window=24: only EAGLE's multi-step drafter .* compile "
                                           "multistep_triton"):
        compile_backend("triton", CompileOptions(max_bs=2, backend=TritonOptions(draft_window=24)))
