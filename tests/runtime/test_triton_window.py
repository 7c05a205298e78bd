"""Triton's sliding-window layers (``sliding_window`` > 0): the window's metadata beside the full layers', with
the window's KV in the full pool or in a pool of its own (``window_pool``: slots translated through the
engine's ``full_to_swa`` table). Compiled eager, captured and replayed (padded, idle) steps against the eager
twin (request by request, the engine's way), the reference interpreter, and hand-computed cases."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, make_pool
from tests.engine import padded_inputs
from tests.oracles import assert_metadata_equal, padded

L, ROWS, MAX_BS, SIZES, W = 128, 20, 8, (1, 4, 8), 24
WINDOW_FIELDS = ("window_kv_indptr", "window_num_kv_splits")


def batch(bs: int, seed: int, pool_slots: int) -> ForwardBatch:
    """Lengths around the window's edge (1, W - 1, W, W + 1) and up to L, and write slots of their own."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([1, W - 1, W, W + 1, L])
    seq = torch.where(torch.rand(bs, generator=g) < 0.5, edges[torch.randint(0, 5, (bs,), generator=g)],
                      torch.randint(1, L + 1, (bs,), generator=g)).to(torch.int32)
    rpi = torch.randperm(ROWS - 1, generator=g)[:bs].to(torch.int64) + 1
    loc = torch.randint(1, pool_slots, (bs,), generator=g)
    return ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq,
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()), out_cache_loc=loc)


def check(cb, be, fb, bs, pool, f2s) -> None:
    """The bound fields against the twin and the interpreter, on the rows the kernels read."""
    full, o = padded(fb, bs), cb.options
    want = get_eager("triton")(pool, MAX_BS, sliding_window=W, full_to_swa=f2s, sm_count=o.sm_count,
                               num_heads=o.num_heads, num_kv_heads=o.num_kv_heads).init_forward_metadata(full)
    m = be.forward_metadata
    n = int(want.window_kv_indptr[bs])
    for f in WINDOW_FIELDS:
        assert torch.equal(getattr(m, f)[: bs + (f.endswith("indptr"))].long(), getattr(want, f).long()), f
    assert torch.equal(m.window_kv_indices[:n].long(), want.window_kv_indices.long())
    assert torch.equal(m.kv_indices[: int(want.kv_indptr[bs])].long(), want.kv_indices.long())
    if f2s is not None:
        assert torch.equal(m.swa_out_cache_loc[:bs], want.swa_out_cache_loc)
    else:
        assert not hasattr(m, "swa_out_cache_loc") or m.swa_out_cache_loc is None
    g = cb.plan(ForwardMode.DECODE, bs).graph
    ref = eval_graph(g, padded_inputs(g, fb, bs, {"req_to_token": pool, **({"full_to_swa": f2s} if f2s is not None
                                                                            else {})}))
    for f in ("window_kv_indptr", "window_num_kv_splits", "swa_out_cache_loc"):
        if f in ref:
            assert torch.equal(getattr(m, f).cpu()[: ref[f].numel()], ref[f]), f


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
@pytest.mark.parametrize("sm_count", [132, 0], ids=["heuristic", "static"])
def test_window_fields_eager_captured_and_replayed(window_pool, sm_count):
    cb = compile_backend("triton", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                  sliding_window=W, window_pool=window_pool, sm_count=sm_count,
                                                  num_heads=8, num_kv_heads=2))
    pool = make_pool(ROWS, L, seed=3)
    slots = ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(4)) if window_pool else None
    pools = {"full_to_swa": f2s} if window_pool else None
    for bs in SIZES:
        be = cb.instantiate(pool, pools=pools)
        cap = batch(bs, bs, slots)
        g = capture(be, cap)
        check(cb, be, cap, bs, pool, f2s)
        for seed, raw in [(11, bs), (12, bs - 1), (13, 0)]:  # another batch, padding, idle
            fb = batch(raw, seed, slots) if raw else ForwardBatch(ForwardMode.IDLE, 0)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            check(cb, be, fb, bs, pool, f2s)
        for seed in (21, 22):  # eager at a size never captured
            fb = batch(3, seed, slots)
            be.init_forward_metadata(fb)
            check(cb, be, fb, 3, pool, f2s)


def test_window_by_hand():
    """W = 4: a request of 2 tokens reads both; one of 6 its last 4 (columns 2..5); the window pool's slot of a
    full slot s is 1000 - s; split counts are static (8 each)."""
    pool = torch.zeros(4, 16, dtype=torch.int32)
    pool[1, :6] = torch.tensor([11, 12, 13, 14, 15, 16])
    pool[2, :2] = torch.tensor([21, 22])
    f2s = 1000 - torch.arange(64)
    cb = compile_backend("triton", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=16, sliding_window=4,
                                                  window_pool=True, sm_count=0, num_heads=8, num_kv_heads=2))
    be = cb.instantiate(pool, pools={"full_to_swa": f2s})
    seq, rpi = torch.tensor([6, 2], dtype=torch.int32), torch.tensor([1, 2])
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                          seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=8,
                                          out_cache_loc=torch.tensor([17, 23])))
    m = be.forward_metadata
    assert m.window_kv_indptr[:3].tolist() == [0, 4, 6]
    assert m.window_kv_indices[:6].tolist() == [987, 986, 985, 984, 979, 978]
    assert m.swa_out_cache_loc[:2].tolist() == [983, 977]
    assert m.window_num_kv_splits[:2].tolist() == [8, 8]
    assert m.kv_indptr[:3].tolist() == [0, 6, 8]  # the full layers still read everything


def spec_batch(mode: ForwardMode, bs: int, seed: int, slots: int) -> ForwardBatch:
    """A verify or draft-extend batch: lengths around the window's edge (verify's D drafts still fit in L),
    D write slots per request, and for draft extend 1..D accepted tokens per request."""
    fb = batch(bs, seed, slots)
    g = torch.Generator().manual_seed(seed + 1)
    seq = fb.seq_lens.clamp(max=L - D)
    ext = torch.minimum(torch.randint(1, D + 1, (bs,), generator=g, dtype=torch.int32), seq)
    return ForwardBatch(mode, bs, req_pool_indices=fb.req_pool_indices, req_pool_indices_cpu=fb.req_pool_indices,
                        seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()),
                        out_cache_loc=torch.randint(1, slots, (bs * D,), generator=g),
                        extend_seq_lens=ext, extend_seq_lens_cpu=ext)


D = 3


@pytest.mark.parametrize("mode", [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND], ids=["verify", "extend"])
@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
def test_window_fields_of_verify_and_draft_extend(mode, window_pool):
    """The window over the cached keys (verify: the prefix; draft extend: the tokens before the extension), its
    first column per request (``window_kv_offsets``), and the D write slots per request translated."""
    cb = compile_backend("triton", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                  sliding_window=W, window_pool=window_pool, num_draft_tokens=D,
                                                  modes=(mode.name.lower(),)))
    pool, slots = make_pool(ROWS, L, seed=5), ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(6)) if window_pool else None
    twin = get_eager("triton")(pool, MAX_BS, draft_tokens=D, sliding_window=W, full_to_swa=f2s)
    for bs in SIZES:
        be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
        g = capture(be, spec_batch(mode, bs, bs, slots))
        for seed, raw in [(31, bs), (32, max(bs - 1, 1))]:
            fb = spec_batch(mode, raw, seed, slots)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            full = padded(fb, bs, mode, D)
            assert_metadata_equal(be.forward_metadata, twin.init_forward_metadata(full), full.seq_lens_cpu)
            want = twin.init_forward_metadata(full)
            assert set(vars(want)) >= {"window_kv_indptr", "window_kv_indices", "window_kv_offsets"}
            assert ("swa_out_cache_loc" in vars(want)) is window_pool


def test_window_offsets_by_hand():
    """Verify with W = 4, D = 2: a prefix of 6 reads columns 2..5 (offset 2); one of 3 reads 0..2 (offset 0)."""
    pool = torch.zeros(4, 16, dtype=torch.int32)
    pool[1, :6] = torch.tensor([11, 12, 13, 14, 15, 16])
    pool[2, :3] = torch.tensor([21, 22, 23])
    cb = compile_backend("triton", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=16, sliding_window=4,
                                                  num_draft_tokens=2, modes=("target_verify",)))
    be = cb.instantiate(pool)
    seq, rpi = torch.tensor([6, 3], dtype=torch.int32), torch.tensor([1, 2])
    be.init_forward_metadata(ForwardBatch(ForwardMode.TARGET_VERIFY, 2, req_pool_indices=rpi,
                                          req_pool_indices_cpu=rpi, seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=9))
    m = be.forward_metadata
    assert m.window_kv_indptr[:3].tolist() == [0, 4, 7]
    assert m.window_kv_indices[:7].tolist() == [13, 14, 15, 16, 21, 22, 23]
    assert m.window_kv_offsets[:2].tolist() == [2, 0]


def test_window_options_are_checked():
    with pytest.raises(OptionsError, match="sliding_window must be an int >= 0"):
        CompileOptions(sliding_window=-1)
    with pytest.raises(OptionsError, match="needs a window"):
        CompileOptions(window_pool=True)


def test_draft_branch_windows_by_hand():
    """attnmeta's triton drafter, W = 4, topk 2, 2 steps, page 1. Pool row r holds 100 r + c at column c; request
    A (row 1) has 5 tokens, B (row 2) one. A branch's drafts follow its prefix: branch k's from column
    seq + 2 k. Step s attends seq + s + 1 keys, a window layer their last min(seq + s + 1, 4): A's branch 1 at
    step 0 reads prefix columns 2..4, then its own first draft at column 7 (5 + 2), jumping over branch 0's
    columns 5 and 6. With a window pool (slot s -> 1000 - s) each branch's write slot of the step, from EAGLE's
    [request, branch, step] layout, translated too."""
    pool = torch.zeros(4, 16, dtype=torch.int32)
    pool[1:3] = (100 * torch.arange(1, 3)[:, None] + torch.arange(16)).to(torch.int32)
    f2s = 1000 - torch.arange(512)
    cb = compile_backend("multistep_triton", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=16,
                                                            sliding_window=4, window_pool=True, sm_count=0,
                                                            num_heads=8, num_kv_heads=2, topk=2, num_steps=2))
    be = cb.instantiate(pool, pools={"full_to_swa": f2s})
    seq, rpi = torch.tensor([5, 1], dtype=torch.int32), torch.tensor([1, 2])
    loc = torch.tensor([10, 11, 20, 21, 30, 31, 40, 41])  # A: branch 0 steps 0, 1, branch 1 steps 0, 1; then B's
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                          seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=6, out_cache_loc=loc))
    m = be.forward_metadata
    full = {0: [[102, 103, 104, 105], [102, 103, 104, 107], [200, 201], [200, 203]],
            1: [[103, 104, 105, 106], [103, 104, 107, 108], [200, 201, 202], [200, 203, 204]]}
    for s, rows in full.items():
        n = [len(r) for r in rows]
        assert m.step(s).window_kv_indptr[:5].tolist() == [sum(n[:i]) for i in range(5)], s
        assert m.step(s).window_kv_indices[: sum(n)].tolist() == [1000 - c for r in rows for c in r], s
        assert m.step(s).swa_out_cache_loc[:4].tolist() == [1000 - x for x in loc.view(2, 2, 2)[:, :, s].flatten()]
    # the full layers still read every key: A's branch 1 at step 0 is its 5 prefix slots and its draft at column 7
    assert m.step(0).kv_indices[6:12].tolist() == [100, 101, 102, 103, 104, 107]
