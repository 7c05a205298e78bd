"""FA3's target verify with EAGLE topk > 1 (``flashattention`` compiled with ``topk > 1``): the prefix
attention's metadata and the per-draft expansion read from the drafter's tree mask, compiled eager, captured
and replayed (padded too), against the eager twin (the engine's way: gather the mask's draft columns, sort
visible before hidden) and the reference interpreter; and a hand-computed case."""

from types import SimpleNamespace

import pytest
import torch

from attnmeta.backends.flashattention.eager import EagerFlashAttentionTreeVerify
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ReplayView
from tests.batches import capture, interp_inputs, make_batch, make_pool

M = ForwardMode
L, ROWS, MAX_BS, SIZES = 96, 12, 6, (2, 6)
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}


def tree_mask(seq: list[int], D: int, g: torch.Generator) -> torch.Tensor:
    """request i: D rows of seq_i + D; each draft sees its prefix, itself and a random set of earlier drafts"""
    parts = []
    for s in seq:
        m = torch.zeros(D, s + D, dtype=torch.bool)
        m[:, :s] = True
        m[:, s:] = torch.rand(D, D, generator=g) < 0.5
        m[:, s:] &= torch.ones(D, D, dtype=torch.bool).tril()
        m[torch.arange(D), s + torch.arange(D)] = True
        parts.append(m.flatten())
    return torch.cat(parts)


def compiled(D: int, P: int):
    """At page size 1 on a sliding-window model too: the window attention's fields meet the interpreter as well."""
    return compile_backend("flashattention", CompileOptions(
        modes=(M.DECODE, M.TARGET_VERIFY), max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, page_size=P,
        num_draft_tokens=D, topk=4, num_steps=3, sliding_window=8 if P == 1 else 0))


def check(cb, be, fb, mask, bs, pool, P, D):
    """the live rows' fields against the twin (what FA3 reads: pages up to each row's keys, the expansion's
    visible slots) and every field of the padded batch against the interpreter"""
    raw = fb.batch_size
    m = be.forward_metadata
    want = EagerFlashAttentionTreeVerify(pool, MAX_BS, P, draft_tokens=D).init_forward_metadata(
        SimpleNamespace(batch_size=raw, seq_lens=fb.seq_lens, seq_lens_cpu=fb.seq_lens_cpu,
                        req_pool_indices=fb.req_pool_indices, custom_mask=mask))
    for f in ("cache_seqlens_int32", "expand_cache_seqlens_int32"):
        assert torch.equal(getattr(m, f)[: len(getattr(want, f))].cpu(), getattr(want, f)), f
    for f in ("cu_seqlens_q", "cu_seqlens_k", "expand_cu_seqlens_q", "expand_cu_seqlens_k"):
        assert torch.equal(getattr(m, f)[: len(getattr(want, f))].cpu(), getattr(want, f)), f
    for i, k in enumerate(want.cache_seqlens_int32.tolist()):
        assert torch.equal(m.page_table[i, : -(-k // P)].cpu(), want.page_table[i, : -(-k // P)]), ("page_table", i)
    # the whole expansion row is written (visible slots first, then the hidden ones), as the engine's sort writes it
    assert torch.equal(m.expand_page_table[: raw * D].cpu(), want.expand_page_table)
    assert int(m.max_seq_len_q) == D
    ins = interp_inputs(fb, bs, pool, FILLS)
    graph = cb.plan(M.TARGET_VERIFY, bs).graph
    # the buffer as the step read it: this batch's mask, then what earlier (longer) steps left (padded rows read it)
    buf = be.bound(M.TARGET_VERIFY, bs).field("custom_mask").cpu()
    assert torch.equal(buf[: mask.numel()], mask)
    ref = eval_graph(graph, ins, written={"custom_mask": buf})
    for field, w in ref.items():
        if isinstance(w, torch.Tensor) and field != "custom_mask":
            assert torch.equal(getattr(m, field).cpu(), w), (field, "interpreter")


def step(be, fb, mask, bs, replay=None):
    be.bound(M.TARGET_VERIFY, bs).field("custom_mask")[: mask.numel()].copy_(mask)  # the drafter writes it
    if replay is None:
        be.init_forward_metadata(fb)
    else:
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        replay.replay()


@pytest.mark.parametrize("D,P", [(4, 1), (6, 16), (5, 64)])
def test_tree_verify_eager_capture_replay_match_the_twin_and_interpreter(D, P):
    cb, pool, g = compiled(D, P), make_pool(ROWS, L, seed=P), torch.Generator().manual_seed(D)
    be = cb.instantiate(pool)
    for raw in (1, 3, MAX_BS):  # eager, any size
        fb = make_batch(raw, L - D, ROWS, seed=raw, mode=M.TARGET_VERIFY)
        mask = tree_mask(fb.seq_lens_cpu.tolist(), D, g)
        step(be, fb, mask, raw)
        check(cb, be, fb, mask, raw, pool, P, D)
    for bs in SIZES:
        graph = capture(be, make_batch(bs, L - D, ROWS, seed=bs, mode=M.TARGET_VERIFY, max_len=3))
        for seed, raw in ((21, bs), (22, max(bs - 1, 1)), (23, 1)):  # long context, padding
            fb = make_batch(raw, L - D, ROWS, seed=seed, mode=M.TARGET_VERIFY)
            mask = tree_mask(fb.seq_lens_cpu.tolist(), D, g)
            step(be, fb, mask, bs, graph)
            check(cb, be, fb, mask, bs, pool, P, D)


def test_tree_verify_by_hand():
    """One request of 3 cached tokens, D = 3 drafts in a chain 0 -> 1 and a sibling 2 of 0: draft 0 sees
    itself; draft 1 sees 0 and itself; draft 2 sees 0 and itself (not 1)."""
    D = 3
    cb = compile_backend("flashattention", CompileOptions(modes=(M.TARGET_VERIFY,), max_bs=1, max_context_len=16,
                                                          num_draft_tokens=D, topk=2, num_steps=2))
    pool = torch.zeros(2, 16, dtype=torch.int32)
    pool[1] = torch.arange(100, 116)
    be = cb.instantiate(pool)
    fb = make_batch(1, 16, 2, seed=0, mode=M.TARGET_VERIFY)
    fb.seq_lens[:] = 3
    fb.seq_lens_cpu[:] = 3
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]], dtype=torch.bool).flatten()
    step(be, fb, mask, 1)
    m = be.forward_metadata
    assert m.cache_seqlens_int32.tolist() == [3] and m.cu_seqlens_q.tolist() == [0, 3]
    assert m.page_table[0, :3].tolist() == [100, 101, 102]
    assert m.expand_cache_seqlens_int32.tolist() == [1, 2, 2]
    assert m.expand_cu_seqlens_k.tolist() == [0, 1, 3, 5] and m.expand_cu_seqlens_q.tolist() == [0, 1, 2, 3]
    # drafts' slots are 103, 104, 105: visible first, in order, then the hidden ones
    assert m.expand_page_table.tolist() == [[103, 104, 105], [103, 104, 105], [103, 105, 104]]
    assert not hasattr(m, "swa_spec_page_table")  # no window, no window attention


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
@pytest.mark.parametrize("replayed", [False, True], ids=["eager", "replayed"])
def test_tree_verify_window_by_hand(replayed, window_pool):
    """The same tree on a sliding-window model: the window layers' one attention per draft query (SGLang's
    ``swa_spec_metadata``) runs over the cached keys, then the drafts the query's mask row shows, in the
    expansion's order; a second request of 2 cached tokens with the drafts in a chain. With a window pool
    (here slot s of the full pool is s + 1000 of the window's) those slots and the drafts' write slots are
    the window pool's."""
    D = 3
    cb = compile_backend("flashattention", CompileOptions(modes=(M.TARGET_VERIFY,), max_bs=2, capture_sizes=(2,),
                                                          max_context_len=16, num_draft_tokens=D, topk=2, num_steps=2,
                                                          sliding_window=4, window_pool=window_pool))
    pool = torch.zeros(3, 16, dtype=torch.int32)
    pool[1], pool[2] = torch.arange(100, 116), torch.arange(200, 216)
    shift = 1000 if window_pool else 0
    be = cb.instantiate(pool, pools={"full_to_swa": torch.arange(300) + shift} if window_pool else None)
    fb = make_batch(2, 16, 3, seed=0, mode=M.TARGET_VERIFY)
    fb.out_cache_loc = torch.tensor([103, 104, 105, 202, 203, 204])
    fb.req_pool_indices[:], fb.req_pool_indices_cpu[:] = torch.tensor([1, 2]), torch.tensor([1, 2])
    fb.seq_lens[:], fb.seq_lens_cpu[:] = torch.tensor([3, 2]), torch.tensor([3, 2])
    one = [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 1]]
    chain = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    mask = torch.cat([torch.tensor(one, dtype=torch.bool).flatten(), torch.tensor(chain, dtype=torch.bool).flatten()])
    if replayed:
        cap = make_batch(2, 16, 3, seed=1, mode=M.TARGET_VERIFY, max_len=3)
        cap.out_cache_loc = torch.zeros(2 * D, dtype=torch.int64)
        graph = capture(be, cap)
        step(be, fb, mask, 2, graph)
    else:
        step(be, fb, mask, 2)
    m = be.forward_metadata
    assert m.swa_spec_cache_seqlens_int32.tolist() == [4, 5, 5, 3, 4, 5]
    assert m.swa_spec_cu_seqlens_k.tolist() == [0, 4, 9, 14, 17, 21, 26]
    rows = [[100, 101, 102, 103], [100, 101, 102, 103, 104], [100, 101, 102, 103, 105],
            [200, 201, 202], [200, 201, 202, 203], [200, 201, 202, 203, 204]]
    for r, want in enumerate(rows):
        assert m.swa_spec_page_table[r, : len(want)].tolist() == [x + shift for x in want], r
    if window_pool:
        assert m.swa_out_cache_loc.tolist()[:6] == [1103, 1104, 1105, 1202, 1203, 1204]


def test_a_window_under_a_tree_is_planned_at_page_size_1_only():
    with pytest.raises(OptionsError, match="page size 1"):
        compile_backend("flashattention", CompileOptions(modes=(M.TARGET_VERIFY,), max_bs=2, max_context_len=64,
                                                         page_size=16, num_draft_tokens=3, topk=2, num_steps=2,
                                                         sliding_window=4))


# --- EAGLE's draft decode with topk > 1 (flashattention_draft compiled with topk > 1) ---
K, S, LD = 4, 4, 640  # the context: each branch's drafts need room past the prefix (a page apiece at most)


def paged_pool(rows: int, width: int, P: int, seed: int) -> torch.Tensor:
    """A request table as a paged allocator fills it: every row whole pages (token j of a page at page * P + j),
    row 0 reserved (zeros)."""
    g = torch.Generator().manual_seed(seed)
    n = -(-width // P)
    pages = (torch.randperm(rows * n, generator=g)[: (rows - 1) * n] + 1).view(rows - 1, n)
    t = torch.zeros(rows, n * P, dtype=torch.int32)
    t[1:] = (pages.repeat_interleave(P, dim=1) * P + torch.arange(n * P) % P).to(torch.int32)
    return t[:, :width].contiguous()


def draft_batch(raw: int, P: int, seed: int, pool: torch.Tensor):
    """A draft round: ``out_cache_loc`` holds each branch's S draft slots (``[bs, K, S]``), the slots EAGLE's
    worker wrote into the request's row for that branch: a page-aligned region after the prefix's whole pages,
    its first seq % P columns the copied partial page (page size 1: from column seq + k * S)."""
    fb = make_batch(raw, LD - 400, ROWS, seed=seed)
    loc = []
    for row, s in zip(fb.req_pool_indices.tolist(), fb.seq_lens_cpu.tolist(), strict=True):
        last = s % P
        stride = -(-(last + S) // P) * P
        loc += [int(pool[row, s - last + k * stride + last + t]) for k in range(K) for t in range(S)]
    fb.out_cache_loc = torch.tensor(loc, dtype=torch.int64)
    return fb


def check_draft(cb, be, fb, bs, pool, P):
    raw = fb.batch_size
    m, want = be.forward_metadata, get_twin(pool, P).init_forward_metadata(fb)
    assert torch.equal(m.cache_seqlens_int32[:raw].cpu(), want.cache_seqlens_int32)
    assert torch.equal(m.cu_seqlens_q[: raw + 1].cpu(), want.cu_seqlens_q) and int(m.max_seq_len_q) == K
    for i, k in enumerate(want.cache_seqlens_int32.tolist()):
        assert torch.equal(m.page_table[i, : -(-k // P)].cpu(), want.page_table[i, : -(-k // P)]), ("page_table", i)
    for s in range(S - 1):
        ours, theirs = m.step(s), want.step(s)
        lens = theirs.expand_cache_seqlens_int32
        assert torch.equal(ours.expand_cache_seqlens_int32[: raw * K].cpu(), lens), s
        for r, k in enumerate(lens.tolist()):  # the pages the branch's keys cover
            assert torch.equal(ours.expand_page_table[r, : -(-k // P)].cpu(), theirs.expand_page_table[r, : -(-k // P)])
        assert torch.equal(ours.expand_cu_seqlens_k[: raw * K + 1].cpu(), theirs.expand_cu_seqlens_k)
    ref = eval_graph(cb.plan(M.DECODE, bs).graph, interp_inputs(fb, bs, pool, FILLS))
    for field, w in ref.items():
        if isinstance(w, torch.Tensor):
            assert torch.equal(getattr(m, field).cpu(), w), (field, "interpreter")


def get_twin(pool, P):
    from attnmeta.backends.flashattention.eager import EagerFlashAttentionTreeDraft

    return EagerFlashAttentionTreeDraft(pool, MAX_BS, P, num_steps=S, topk=K)


@pytest.mark.parametrize("P", [1, 16, 64])
def test_tree_draft_eager_capture_replay_match_the_twin_and_interpreter(P):
    cb = compile_backend("flashattention_draft", CompileOptions(
        modes=(M.DECODE,), max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=LD, page_size=P, num_draft_tokens=6,
        topk=K, num_steps=S))
    pool = paged_pool(ROWS, LD, P, seed=P)
    be = cb.instantiate(pool)
    for raw in (1, 4):
        fb = draft_batch(raw, P, raw, pool)
        be.init_forward_metadata(fb)
        check_draft(cb, be, fb, raw, pool, P)
    for bs in SIZES:
        graph = capture(be, draft_batch(bs, P, 40 + bs, pool))
        for seed, raw in ((31, bs), (32, max(bs - 1, 1))):
            fb = draft_batch(raw, P, seed, pool)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            graph.replay()
            check_draft(cb, be, fb, bs, pool, P)


def test_tree_draft_by_hand():
    """Page size 4, one request of 6 cached tokens (one whole page, 2 tokens on the next), topk 2, S = 4: the
    prefix covers its 4 whole-page tokens. Each branch's region starts at a page after the prefix's whole pages,
    8 columns apart (ceil((2 + 4) / 4) pages each): branch 0 at column 4 (slots 12.., pages 3, 4), branch 1 at
    column 12 (pages 5, 6). Step s covers the 2 copied tokens and s + 1 drafts: one page up to step 1, two at
    step 2."""
    P = 4
    cb = compile_backend("flashattention_draft", CompileOptions(modes=(M.DECODE,), max_bs=1, max_context_len=64,
                                                                page_size=P, num_draft_tokens=4, topk=2, num_steps=4))
    pool = torch.zeros(2, 64, dtype=torch.int32)
    pool[1] = torch.arange(8, 72)  # column c at slot 8 + c: page 2 + c // 4
    be = cb.instantiate(pool)
    fb = make_batch(1, 32, 2, seed=0)
    fb.seq_lens[:], fb.seq_lens_cpu[:] = 6, 6
    be.init_forward_metadata(fb)
    m = be.forward_metadata
    assert m.cache_seqlens_int32.tolist() == [4] and m.page_table[0, :1].tolist() == [2]
    assert m.cu_seqlens_q.tolist() == [0, 2] and int(m.max_seq_len_q) == 2
    assert [m.step(s).expand_cache_seqlens_int32.tolist() for s in range(3)] == [[3, 3], [4, 4], [5, 5]]
    assert m.step(1).expand_page_table[:, :1].tolist() == [[3], [5]]
    assert m.step(2).expand_page_table[:, :2].tolist() == [[3, 4], [5, 6]]
    assert m.expand_cu_seqlens_q.tolist() == [0, 1, 2] and m.step(2).expand_cu_seqlens_k.tolist() == [0, 3, 6]


def test_a_context_too_short_for_the_branches_is_refused_at_compile():
    from attnmeta.compiler.ir.errors import OptionsError

    with pytest.raises(OptionsError, match=r"reads 100 request-table columns .* above 100 \(--max-context-len\)"):
        compile_backend("flashattention_draft", CompileOptions(modes=(M.DECODE,), max_bs=2, max_context_len=96,
                                                               page_size=16, num_draft_tokens=6, topk=K, num_steps=S))
