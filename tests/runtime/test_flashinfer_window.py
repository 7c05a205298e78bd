"""FlashInfer's sliding-window layers (``sliding_window`` = W > 0, decode): a second wrapper's stream beside the full
layers' (the last min(seq, W + 1) slots: FlashInfer's window counts the current token besides the W before it),
with the window's KV in the full pool or in a pool of its own (``window_pool``: slots translated through the
engine's ``full_to_swa`` table, and the step's write slots with them), planned as the full wrapper is (host
indptr, or the partition on the device). Compiled eager, captured and replayed (padded, idle) steps against the
eager twin (request by request), the reference interpreter and a hand-computed case. EAGLE's target verify (topk 1)
and draft extend plan the window layers' prefill wrapper the same way, over the last min(keys, W + D) slots, where
the D queries are the last keys; what the window cannot serve is refused at compile time."""

import pytest
import torch

from attnmeta.backends.flashinfer.eager import EagerFlashInferDecode
from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, make_pool, replay_then_eager
from tests.engine import padded_inputs
from tests.oracles import padded

L, ROWS, MAX_BS, SIZES, W = 128, 20, 8, (1, 4, 8), 24


def batch(bs: int, seed: int, slots: int) -> ForwardBatch:
    """Lengths around the window's edge (1, W, W + 1, W + 2) and up to L, and write slots of their own."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([1, W, W + 1, W + 2, L])
    seq = torch.where(torch.rand(bs, generator=g) < 0.5, edges[torch.randint(0, 5, (bs,), generator=g)],
                      torch.randint(1, L + 1, (bs,), generator=g)).to(torch.int32)
    rpi = torch.randperm(ROWS - 1, generator=g)[:bs].to(torch.int64) + 1
    return ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq,
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()), out_cache_loc=torch.randint(1, slots, (bs,),
                                                                                                generator=g))


def check(cb, be, fb, bs, pool, f2s, on_device: bool) -> None:
    """Both wrappers' streams against the twin (on the rows the kernels read) and the interpreter; each wrapper
    planned over its own stream."""
    want = EagerFlashInferDecode(pool, MAX_BS, sliding_window=W, full_to_swa=f2s).init_forward_metadata(
        padded(fb, bs))
    m = be.forward_metadata
    n, nw = int(want.kv_indptr[bs]), int(want.window_kv_indptr[bs])
    assert torch.equal(m.kv_indptr[: bs + 1], want.kv_indptr)
    assert torch.equal(m.kv_indices[:n].long(), want.kv_indices.long())
    assert torch.equal(m.window_kv_indptr[: bs + 1], want.window_kv_indptr)
    assert torch.equal(m.window_kv_indices[:nw].long(), want.window_kv_indices.long())
    if f2s is not None:
        assert torch.equal(m.swa_out_cache_loc[:bs], want.swa_out_cache_loc)
    else:
        assert not hasattr(m, "swa_out_cache_loc")
    assert m.plan is not m.plan_window  # two wrappers, two sites
    if not on_device:  # the host planner of each wrapper got its own stream's total
        assert torch.equal(m.window_kv_indptr_host[: bs + 1], want.window_kv_indptr_host)
        assert (m.plan.total_kv, m.plan_window.total_kv) == (n, nw)
    g = cb.plan(ForwardMode.DECODE, bs).graph
    ref = eval_graph(g, padded_inputs(g, fb, bs, {"req_to_token": pool, **({"full_to_swa": f2s} if f2s is not None
                                                                            else {})}))
    for f in ("window_kv_indptr", "swa_out_cache_loc"):
        if f in ref:
            assert torch.equal(getattr(m, f).cpu()[: ref[f].numel()], ref[f]), f


@pytest.mark.parametrize("on_device", [False, True], ids=["host-plan", "device-plan"])
@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
def test_window_wrapper_eager_captured_and_replayed(window_pool, on_device):
    cb = compile_backend("flashinfer", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, sliding_window=W, window_pool=window_pool,
        backend=FlashInferOptions(plan_on_device=on_device)))
    pool, slots = make_pool(ROWS, L, seed=3), ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(4)) if window_pool else None
    for bs in SIZES:
        be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
        cap = batch(bs, bs, slots)
        g = capture(be, cap)
        check(cb, be, cap, bs, pool, f2s, on_device)
        replay_then_eager(be, g, bs, lambda raw, seed: batch(raw, seed, slots),
                          lambda fb, n, be=be: check(cb, be, fb, n, pool, f2s, on_device))


def test_window_wrapper_by_hand():
    """W = 3: a request of 6 tokens reads its last 4 (columns 2..5), one of 2 both; the window pool's slot of a
    full slot s is 1000 - s. The full wrapper still reads all 8."""
    pool = torch.zeros(4, 16, dtype=torch.int32)
    pool[1, :6] = torch.tensor([11, 12, 13, 14, 15, 16])
    pool[2, :2] = torch.tensor([21, 22])
    cb = compile_backend("flashinfer", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=16,
                                                      sliding_window=3, window_pool=True))
    be = cb.instantiate(pool, pools={"full_to_swa": 1000 - torch.arange(64)})
    seq, rpi = torch.tensor([6, 2], dtype=torch.int32), torch.tensor([1, 2])
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                          seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=8,
                                          out_cache_loc=torch.tensor([17, 23])))
    m = be.forward_metadata
    assert m.window_kv_indptr[:3].tolist() == [0, 4, 6]
    assert m.window_kv_indices[:6].tolist() == [987, 986, 985, 984, 979, 978]
    assert m.swa_out_cache_loc[:2].tolist() == [983, 977]
    assert m.kv_indptr[:3].tolist() == [0, 6, 8]
    assert m.kv_indices[:8].tolist() == [11, 12, 13, 14, 15, 16, 21, 22]


D = 3  # verify's drafts, draft extend's slots per request


def spec_batch(mode, bs: int, seed: int, slots: int) -> ForwardBatch:
    """A verify or draft extend batch: lengths around the window's edge and up to L - D (verify reads D slots past
    them), D write slots per request."""
    fb = batch(bs, seed, slots)
    seq = fb.seq_lens.clamp(max=L - D) if mode is ForwardMode.TARGET_VERIFY else fb.seq_lens.clamp(min=D)
    g = torch.Generator().manual_seed(seed + 100)
    return ForwardBatch(mode, bs, req_pool_indices=fb.req_pool_indices, req_pool_indices_cpu=fb.req_pool_indices_cpu,
                        seq_lens=seq, seq_lens_cpu=seq.clone(), seq_lens_sum=int(seq.sum()),
                        out_cache_loc=torch.randint(1, slots, (bs * D,), generator=g))


def check_spec(mode, be, fb, bs, pool, f2s, on_device: bool) -> None:
    """Verify / draft extend: both prefill wrappers' streams against the twin on the rows they read, the window's
    write slots (D per request), each wrapper planned over its own stream."""
    want = EagerFlashInferDecode(pool, MAX_BS, D, sliding_window=W, full_to_swa=f2s).init_forward_metadata(
        padded(fb, bs, mode, per=D))
    m = be.forward_metadata
    n, nw = int(want.kv_indptr[bs]), int(want.window_kv_indptr[bs])
    for f, k in (("kv_indptr", bs + 1), ("kv_indices", n), ("window_kv_indptr", bs + 1), ("window_kv_indices", nw),
                 ("qo_indptr", bs + 1)):
        assert torch.equal(getattr(m, f)[:k].long().cpu(), getattr(want, f)[:k].long().cpu()), f
    if f2s is not None:
        assert torch.equal(m.swa_out_cache_loc[: bs * D], want.swa_out_cache_loc)
    assert m.plan is not m.plan_window
    if not on_device:
        assert torch.equal(m.window_kv_indptr_host[: bs + 1], want.window_kv_indptr_host)
        assert (m.plan.total_kv, m.plan_window.total_kv) == (n, nw)


@pytest.mark.parametrize("on_device", [False, True], ids=["host-plan", "device-plan"])
@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
@pytest.mark.parametrize("mode", [ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND], ids=["verify", "extend"])
def test_verify_and_draft_extend_window_wrappers(mode, window_pool, on_device):
    """The window layers' prefill wrapper of verify (the last min(seq, W) of the prefix, then the D drafts) and of
    draft extend (the last min(seq, W + D) of a sequence whose last D slots are its queries): compiled eager,
    captured and replayed (padded, idle) against the eager twin."""
    cb = compile_backend("flashinfer", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, sliding_window=W, window_pool=window_pool,
        num_draft_tokens=D, modes=("decode", mode.name.lower()), backend=FlashInferOptions(plan_on_device=on_device)))
    pool, slots = make_pool(ROWS, L, seed=5), ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(6)) if window_pool else None
    for bs in SIZES:
        be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
        cap = spec_batch(mode, bs, bs, slots)
        g = capture(be, cap)
        check_spec(mode, be, cap, bs, pool, f2s, on_device)
        for seed, raw in [(11, bs), (12, bs - 1), (14, bs)]:  # replayed: full, padded, full again
            if raw:
                fb = spec_batch(mode, raw, seed, slots)
                be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
                g.replay()
                check_spec(mode, be, fb, bs, pool, f2s, on_device)
        for seed in (21, 22):  # eager, at a size never captured
            fb = spec_batch(mode, 3, seed, slots)
            be.init_forward_metadata(fb)
            check_spec(mode, be, fb, 3, pool, f2s, on_device)


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
def test_every_window_mode_of_one_backend_interleaved(window_pool):
    """Decode, verify and draft extend compiled together on one instance, every size captured in each mode, then
    steps interleaved across modes and sizes (replayed, padded, and eager at a size never captured): each step's
    window and full streams against the twin, so no mode's buffers or plans alias another's."""
    cb = compile_backend("flashinfer", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, sliding_window=W, window_pool=window_pool,
        num_draft_tokens=D, modes=("decode", "idle", "target_verify", "draft_extend"),
        backend=FlashInferOptions(plan_on_device=True)))
    pool, slots = make_pool(ROWS, L, seed=7), ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(8)) if window_pool else None
    be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
    modes = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)
    make = {ForwardMode.DECODE: lambda n, seed: batch(n, seed, slots)}
    make |= {m: (lambda n, seed, m=m: spec_batch(m, n, seed, slots)) for m in modes[1:]}
    graphs = {(m, bs): capture(be, make[m](bs, bs)) for bs in sorted(SIZES, reverse=True) for m in modes}
    for step in range(18):
        m, bs = modes[step % 3], SIZES[(step // 3) % len(SIZES)]
        n = max(bs - step % 2, 1)  # full, then padded
        fb = make[m](n, 100 + step)
        if step % 6 == 5:
            n = 3
            fb = make[m](n, 100 + step)
            be.init_forward_metadata(fb)  # eager, at a size never captured
        else:
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            graphs[(m, bs)].replay()
            n = bs
        if m is ForwardMode.DECODE:
            check(cb, be, fb, n, pool, f2s, True)
        else:
            check_spec(m, be, fb, n, pool, f2s, True)


def test_verify_window_by_hand():
    """W = 3, D = 2: a request of 6 cached tokens (slots 11..16, drafts 17, 18) has its window wrapper read its
    last 3 and both drafts, 14..18 (the first draft sees 14, 15, 16 and itself: W before it); one of 1 token
    (21, drafts 22, 23) reads all 3. The window pool's slot of s is 1000 - s; the drafts' write slots translate."""
    pool = torch.zeros(4, 16, dtype=torch.int32)
    pool[1, :8] = torch.arange(11, 19, dtype=torch.int32)
    pool[2, :3] = torch.tensor([21, 22, 23], dtype=torch.int32)
    cb = compile_backend("flashinfer", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=16,
                                                      sliding_window=3, window_pool=True, num_draft_tokens=2,
                                                      modes=("decode", "target_verify")))
    be = cb.instantiate(pool, pools={"full_to_swa": 1000 - torch.arange(64)})
    seq, rpi = torch.tensor([6, 1], dtype=torch.int32), torch.tensor([1, 2])
    be.init_forward_metadata(ForwardBatch(ForwardMode.TARGET_VERIFY, 2, req_pool_indices=rpi,
                                          req_pool_indices_cpu=rpi, seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=7,
                                          out_cache_loc=torch.tensor([17, 18, 22, 23])))
    m = be.forward_metadata
    assert m.window_kv_indptr[:3].tolist() == [0, 5, 8]
    assert m.window_kv_indices[:8].tolist() == [986, 985, 984, 983, 982, 979, 978, 977]
    assert m.swa_out_cache_loc[:4].tolist() == [983, 982, 978, 977]
    assert m.kv_indptr[:3].tolist() == [0, 8, 11] and m.qo_indptr[:3].tolist() == [0, 2, 4]
    assert (m.plan.total_kv, m.plan_window.total_kv) == (11, 8)


def test_what_the_window_cannot_serve_is_refused():
    """Extend (prefill) runs the engine's own wrappers; a tree verify (topk > 1) with the host planner has no host
    lengths for its window streams (tests/runtime/test_flashinfer_window_tree.py serves it with the device's)."""
    with pytest.raises(OptionsError, match="not extend"):
        compile_backend("flashinfer", CompileOptions(max_bs=2, max_context_len=16, sliding_window=3,
                                                     modes=("decode", "extend")))
    with pytest.raises(OptionsError, match=r"draft tree \(topk 4\).*planned on the GPU only"):
        compile_backend("flashinfer", CompileOptions(max_bs=2, max_context_len=16, sliding_window=3, topk=4,
                                                     num_draft_tokens=6, modes=("decode", "target_verify")))
    cb = compile_backend("flashinfer", CompileOptions(max_bs=2, max_context_len=16, sliding_window=3, topk=4,
                                                      num_draft_tokens=6, modes=("decode", "draft_extend")))
    assert "plan_window" in {o.field for o in cb.plan(ForwardMode.DRAFT_EXTEND, 2).graph.outputs}  # no tree: served
