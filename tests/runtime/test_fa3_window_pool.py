"""FlashAttention's metadata for a sliding-window model whose window layers keep their KV in a pool of their own
(``window_pool``): the same pages translated into that pool through the engine's ``full_to_swa`` slot table
(``swa_page_table``: the window pool's page of each page's first slot) and the step's write slots translated
(``swa_out_cache_loc``). Captured and replayed (padded) steps, decode, verify and draft extend, against
hand-computed values and the reference interpreter."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ForwardBatch, ReplayView
from tests import batches
from tests.batches import capture
from tests.engine import padded_inputs

L, ROWS, MAX_BS, SIZES, D = 128, 12, 4, (1, 4), 3


def paged_pool(P: int, seed: int) -> torch.Tensor:
    return batches.paged_pool(ROWS, L, P, seed)


def window_table(P: int, seed: int) -> torch.Tensor:
    return batches.window_table(ROWS, L, P, seed)


def batch(mode, bs: int, seed: int, dev="cpu") -> ForwardBatch:
    g = torch.Generator().manual_seed(seed)
    T = 1 if mode is ForwardMode.DECODE else D
    seq = torch.randint(1, L - 2 * D, (bs,), generator=g, dtype=torch.int32)
    rpi = torch.randperm(ROWS - 1, generator=g)[:bs].to(torch.int64) + 1
    loc = torch.randint(1, ROWS * L, (bs * T,), generator=g)
    kw = {}
    if mode is ForwardMode.DRAFT_EXTEND:
        ext = torch.full((bs,), D, dtype=torch.int32)
        kw = dict(extend_seq_lens=ext, extend_seq_lens_cpu=ext)
    if "extend_seq_lens" in kw:
        kw["extend_seq_lens"] = kw["extend_seq_lens"].to(dev)
    return ForwardBatch(mode, bs, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()), out_cache_loc=loc.to(dev), **kw)


def check(cb, be, fb, bs, pool, f2s, P, interpreter: bool = True) -> None:
    """The window pool's fields by hand (and the full layers' keys), then against the reference interpreter."""
    m, mode = be.forward_metadata, fb.forward_mode
    keys = fb.seq_lens_cpu.long() + (D if mode is ForwardMode.TARGET_VERIFY else 0)
    for i in range(fb.batch_size):  # by hand: each page's first slot, translated, as a page of the window pool
        pages = -(-int(keys[i]) // P)
        want = [int(f2s[int(pool[int(fb.req_pool_indices[i]), k * P])]) // P for k in range(pages)]
        assert m.swa_page_table[i, :pages].tolist() == want, (mode, i)
    n = fb.out_cache_loc.numel()
    assert m.swa_out_cache_loc[:n].tolist() == f2s[fb.out_cache_loc].tolist()
    assert m.cache_seqlens_int32[: fb.batch_size].tolist() == keys.tolist()  # the full layers' keys, unchanged
    if not interpreter:
        return
    g = cb.plan(mode, bs).graph
    ref = eval_graph(g, padded_inputs(g, fb, bs, {"req_to_token": pool, "full_to_swa": f2s}))
    assert torch.equal(m.swa_page_table[:bs], ref["swa_page_table"])
    assert torch.equal(m.swa_out_cache_loc[:n], ref["swa_out_cache_loc"][:n])


@pytest.mark.parametrize("P", [1, 16])
@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND],
                         ids=["decode", "verify", "extend"])
def test_window_pool_pages_and_write_slots(mode, P):
    cb = compile_backend("flashattention", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, page_size=P, sliding_window=24, window_pool=True,
        num_draft_tokens=D, modes=("decode", "idle", "target_verify", "draft_extend")))
    pool, f2s = paged_pool(P, 1), window_table(P, 2)
    for bs in SIZES:
        be = cb.instantiate(pool, pools={"full_to_swa": f2s})
        cap = batch(mode, bs, bs)
        g = capture(be, cap)
        check(cb, be, cap, bs, pool, f2s, P)
        for seed, raw in [(11, bs), (12, max(bs - 1, 1))]:  # another batch, and one padded to the captured size
            fb = batch(mode, raw, seed)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            check(cb, be, fb, bs, pool, f2s, P)


def test_a_window_pool_is_refused_where_it_is_not_planned():
    base = dict(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, sliding_window=24, window_pool=True)
    with pytest.raises(OptionsError, match="page size 1"):
        compile_backend("flashattention", CompileOptions(**base, topk=4, num_draft_tokens=8, num_steps=3,
                                                         modes=("target_verify",), page_size=16))
    with pytest.raises(OptionsError, match="draft decode with topk > 1"):
        compile_backend("flashattention_draft", CompileOptions(**base, num_steps=3, topk=4))


@pytest.mark.parametrize("P", [1, 16])
def test_the_drafters_steps_in_the_window_pool(P):
    """EAGLE's draft decode (topk 1): step i reads the prefix and i + 1 drafts, and writes each request's i-th
    draft slot (``out_cache_loc`` holds every request's S slots in a row); in the window pool, captured and
    replayed, by hand."""
    S = 3
    cb = compile_backend("flashattention_draft", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, page_size=P, sliding_window=24, window_pool=True,
        num_steps=S, modes=("decode", "idle")))
    pool, f2s = paged_pool(P, 5), window_table(P, 6)
    for bs in SIZES:
        be = cb.instantiate(pool, pools={"full_to_swa": f2s})
        cap = batch(ForwardMode.DECODE, bs, bs)
        cap.out_cache_loc = torch.zeros(bs * S, dtype=torch.int64)
        g = capture(be, cap)
        for seed, raw in [(31, bs), (32, max(bs - 1, 1))]:
            fb = batch(ForwardMode.DECODE, raw, seed)
            fb.out_cache_loc = torch.randint(1, ROWS * L, (raw * S,), generator=torch.Generator().manual_seed(seed))
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            m = be.forward_metadata
            for i in range(S):
                st = m.step(i)
                for r in range(raw):
                    keys = int(fb.seq_lens_cpu[r]) + i + 1
                    row = int(fb.req_pool_indices_cpu[r])
                    want = [int(f2s[int(pool[row, k * P])]) // P for k in range(-(-keys // P))]
                    assert st.swa_page_table[r, : len(want)].tolist() == want, (i, r)
                assert st.swa_out_cache_loc[:raw].tolist() == f2s[fb.out_cache_loc.view(raw, S)[:, i]].tolist(), i
