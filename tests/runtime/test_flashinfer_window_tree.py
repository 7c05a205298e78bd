"""FlashInfer's sliding-window layers under EAGLE topk > 1 (a tree verify): the window wrapper gets one batch item per
draft query, its keys the last min(seq, W) cached ones and then the drafts its tree-mask row shows, planned causal
with FlashInfer's window W, so FlashInfer keeps each item's last W + 1 keys. Checked compiled eager, captured and
replayed (padded) against the eager twin and the interpreter, one pool and a window pool; by hand; and against
the window itself: for random trees, the keys FlashInfer keeps of each item are exactly the slots of the positions
a query at depth d sees (seq + d - W .. seq - 1, then its ancestors and itself), with the depth taken from the
tree's parents, not from the mask the metadata reads."""


from types import SimpleNamespace

import pytest
import torch

from attnmeta.backends.flashinfer.eager import EagerFlashInferDecode
from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, interp_inputs, make_pool

M = ForwardMode
L, ROWS, MAX_BS, SIZES, W, D = 64, 12, 4, (2, 4), 6, 4
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}


def compiled(window_pool: bool, on_device: bool = True):
    return compile_backend("flashinfer", CompileOptions(
        modes=(M.DECODE, M.TARGET_VERIFY), max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, num_draft_tokens=D,
        topk=2, num_steps=3, sliding_window=W, window_pool=window_pool,
        backend=FlashInferOptions(plan_on_device=on_device)))


def tree(g: torch.Generator) -> list[int]:
    """Parents of D drafts as EAGLE grows a tree: draft 0 hangs off the cached keys (-1), each later one off an
    earlier draft."""
    return [-1] + [int(torch.randint(0, c, (1,), generator=g)) for c in range(1, D)]


def ancestry(parents: list[int]) -> list[list[int]]:
    """Per draft, itself and its ancestors (ascending)."""
    out = []
    for c in range(D):
        chain, p = [], c
        while p >= 0:
            chain.append(p)
            p = parents[p]
        out.append(sorted(chain))
    return out


def batch(bs: int, seed: int, slots: int) -> tuple[ForwardBatch, torch.Tensor, list[list[int]]]:
    """Lengths around the window's edge and up to L - D, a random tree per request; its mask as EAGLE writes it
    (D rows of seq + D: every cached key, then the draft's ancestors and itself)."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([1, W - 1, W, W + 1, L - D])
    seq = torch.where(torch.rand(bs, generator=g) < 0.5, edges[torch.randint(0, 5, (bs,), generator=g)],
                      torch.randint(1, L - D + 1, (bs,), generator=g)).to(torch.int32)
    rpi = torch.randperm(ROWS - 1, generator=g)[:bs].to(torch.int64) + 1
    parts, parents = [], []
    for s in seq.tolist():
        parents.append(tree(g))
        m = torch.zeros(D, s + D, dtype=torch.bool)
        m[:, :s] = True
        for c, seen in enumerate(ancestry(parents[-1])):
            m[c, [s + x for x in seen]] = True
        parts.append(m.flatten())
    fb = ForwardBatch(M.TARGET_VERIFY, bs, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq,
                      seq_lens_cpu=seq.clone(), seq_lens_sum=int(seq.sum()),
                      out_cache_loc=torch.randint(1, slots, (bs * D,), generator=g))
    return fb, torch.cat(parts), parents


def step(be, fb, mask, bs: int, graph=None) -> None:
    be.bound(M.TARGET_VERIFY, bs).field("custom_mask")[: mask.numel()].copy_(mask)  # the drafter writes it
    if graph is None:
        be.init_forward_metadata(fb)
    else:
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        graph.replay()


def check(cb, be, fb, mask, parents, bs: int, pool, f2s) -> None:
    raw, m = fb.batch_size, be.forward_metadata
    twin = SimpleNamespace(**{k: getattr(fb, k) for k in ("forward_mode", "batch_size", "seq_lens", "seq_lens_cpu",
                                                          "req_pool_indices", "out_cache_loc")}, custom_mask=mask)
    want = EagerFlashInferDecode(pool, MAX_BS, D, sliding_window=W, full_to_swa=f2s).init_forward_metadata(twin)
    n = int(want.window_kv_indptr[-1])
    assert torch.equal(m.window_kv_indptr[: raw * D + 1].cpu(), want.window_kv_indptr.cpu())
    assert torch.equal(m.window_kv_indices[:n].long().cpu(), want.window_kv_indices.long().cpu())
    assert torch.equal(m.window_qo_indptr[: raw * D + 1].cpu(), want.window_qo_indptr.cpu())
    assert torch.equal(m.kv_indices[: int(want.kv_indptr[-1])].long().cpu(), want.kv_indices.long().cpu())
    if f2s is not None:
        assert torch.equal(m.swa_out_cache_loc[: raw * D], want.swa_out_cache_loc)
    assert m.plan is not m.plan_window
    kept(m, fb, parents, pool, f2s)
    ins = interp_inputs(fb, bs, pool, FILLS)
    if f2s is not None:
        ins |= {"full_to_swa": f2s, "out_cache_loc": torch.cat([fb.out_cache_loc, torch.zeros(
            (bs - raw) * D, dtype=torch.int64)])}
    buf = be.bound(M.TARGET_VERIFY, bs).field("custom_mask").cpu()  # the mask as the step read it
    ref = eval_graph(cb.plan(M.TARGET_VERIFY, bs).graph, ins, written={"custom_mask": buf})
    live = int(ref["window_kv_indptr"][-1])  # a ragged buffer past its rows holds what longer steps left
    for f, k in (("window_kv_indptr", None), ("window_kv_indices", live), ("window_qo_indptr", None),
                 ("swa_out_cache_loc", None)):
        if f in ref:
            k = ref[f].numel() if k is None else k
            assert torch.equal(getattr(m, f).cpu()[:k], ref[f][:k]), (f, "interpreter")


def kept(m, fb, parents, pool, f2s) -> None:
    """What FlashInfer attends per item (its last W + 1 keys: the query is the item's last) against the window by
    positions: a draft at depth d sits at seq + d and sees positions seq + d - W and on, cached or its ancestors."""
    indptr, idx = m.window_kv_indptr.cpu().tolist(), m.window_kv_indices.cpu().long()
    for i, (r, s) in enumerate(zip(fb.req_pool_indices.tolist(), fb.seq_lens_cpu.tolist(), strict=True)):
        for c, seen in enumerate(ancestry(parents[i])):
            z, d = i * D + c, len(seen) - 1
            keys = idx[indptr[z]: indptr[z + 1]][-(W + 1):]
            want = pool[r, [*range(max(s + d - W, 0), s), *(s + x for x in seen)]].long()
            if f2s is not None:
                want = f2s[want]
            assert sorted(keys.tolist()) == sorted(want.tolist()), (i, c, "window by position")


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
def test_tree_window_eager_captured_and_replayed(window_pool):
    cb, pool = compiled(window_pool), make_pool(ROWS, L, seed=9)
    slots = ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(10)) if window_pool else None
    be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
    for raw in (1, 3):  # eager, at sizes never captured
        fb, mask, parents = batch(raw, raw, slots)
        step(be, fb, mask, raw)
        check(cb, be, fb, mask, parents, raw, pool, f2s)
    for bs in SIZES:
        graph = capture(be, batch(bs, 40 + bs, slots)[0])
        for seed, raw in ((41, bs), (42, bs - 1), (43, bs)):  # full, padded, full again
            fb, mask, parents = batch(raw, seed * bs, slots)
            step(be, fb, mask, bs, graph)
            check(cb, be, fb, mask, parents, bs, pool, f2s)


def test_tree_window_by_hand():
    """W = 3, D = 3. Request 1: 6 cached tokens (slots 11..16), drafts 17, 18, 19: 0 the root, 1 and 2 its
    children. Each item: the last 3 cached slots, then its ancestors and itself. Request 2: 1 cached token (21),
    drafts 22, 23, 24 in a chain."""
    cb = compile_backend("flashinfer", CompileOptions(
        modes=(M.TARGET_VERIFY,), max_bs=2, capture_sizes=(2,), max_context_len=16, num_draft_tokens=3, topk=2,
        num_steps=2, sliding_window=3, backend=FlashInferOptions(plan_on_device=True)))
    pool = torch.zeros(3, 16, dtype=torch.int32)
    pool[1, :9] = torch.arange(11, 20, dtype=torch.int32)
    pool[2, :4] = torch.arange(21, 25, dtype=torch.int32)
    be = cb.instantiate(pool)
    seq, rpi = torch.tensor([6, 1], dtype=torch.int32), torch.tensor([1, 2])
    fb = ForwardBatch(M.TARGET_VERIFY, 2, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq,
                      seq_lens_cpu=seq.clone(), seq_lens_sum=7)

    def rows(s, shown):
        m = torch.zeros(3, s + 3, dtype=torch.bool)
        m[:, :s] = True
        m[:, s:] = torch.tensor(shown, dtype=torch.bool)
        return m.flatten()

    mask = torch.cat([rows(6, [[1, 0, 0], [1, 1, 0], [1, 0, 1]]), rows(1, [[1, 0, 0], [1, 1, 0], [1, 1, 1]])])
    step(be, fb, mask, 2)
    m = be.forward_metadata
    assert m.window_qo_indptr.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert m.window_kv_indptr.tolist() == [0, 4, 9, 14, 16, 19, 23]
    assert m.window_kv_indices[:23].tolist() == [14, 15, 16, 17, 14, 15, 16, 17, 18, 14, 15, 16, 17, 19,
                                                 21, 22, 21, 22, 23, 21, 22, 23, 24]
    assert m.kv_indptr.tolist() == [0, 9, 13]  # the full layers' wrapper: every key, the tree mask


def test_tree_window_needs_the_device_planner():
    with pytest.raises(OptionsError, match=r"plan_on_device=True.*speculative-eagle-topk 1"):
        compiled(False, on_device=False)
