"""FlashAttention's chunked local attention (Llama 4's iRoPE layers; ``FlashAttentionOptions.attention_chunk`` = C):
in decode each request's current chunk is one batch item, its keys that chunk's tokens so far and its pages that
chunk's, from the full pool's page table or, where the chunked layers keep their KV in a pool of their own, the
window pool's; in target verify (topk 1) each chunk the D queries fall in is one (two where they run into the next
chunk). Compiled eager, captured and replayed (padded, idle) steps against the eager twin (request by request),
the reference interpreter, and hand-computed cases; decode and verify interleaved on one backend; bad options and
other modes are refused."""

import pytest
import torch

from attnmeta.backends.flashattention.eager import EagerFlashAttentionDecode
from attnmeta.backends.flashattention.spec import FlashAttentionOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, paged_pool, replay_then_eager, window_table
from tests.engine import padded_inputs
from tests.oracles import padded

L, ROWS, MAX_BS, SIZES, C = 256, 20, 8, (1, 4, 8), 64


def batch(bs: int, seed: int, slots: int) -> ForwardBatch:
    """Lengths at the chunks' edges (1, C, C + 1, 2C, 2C + 1) and up to L, and write slots of their own."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([1, C, C + 1, 2 * C, 2 * C + 1, L])
    seq = torch.where(torch.rand(bs, generator=g) < 0.5, edges[torch.randint(0, 6, (bs,), generator=g)],
                      torch.randint(1, L + 1, (bs,), generator=g)).to(torch.int32)
    rpi = torch.randperm(ROWS - 1, generator=g)[:bs].to(torch.int64) + 1
    return ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq,
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()), out_cache_loc=torch.randint(1, slots, (bs,),
                                                                                                generator=g))


def check(cb, be, fb, bs: int, pool, P: int, f2s) -> None:
    """The local fields against the twin on what the kernel reads (a row's first ceil(keys / P) pages), and
    against the interpreter."""
    want = EagerFlashAttentionDecode(pool, MAX_BS, page_size=P, attention_chunk=C).init_forward_metadata(
        padded(fb, bs))
    m, live = be.forward_metadata, fb.batch_size
    assert torch.equal(m.local_query_start_loc[: bs + 1], want.local_query_start_loc)
    assert torch.equal(m.local_seqused_k[:live], want.local_seqused_k[:live])
    for i in range(live):
        pages = want.local_block_table[i].long()
        if f2s is not None:  # the window pool's page of each page's first slot
            pages = f2s[pages * P] // P
        assert m.local_block_table[i, : pages.numel()].long().tolist() == pages.tolist(), i
    g = cb.plan(ForwardMode.DECODE, bs).graph
    ref = eval_graph(g, padded_inputs(g, fb, bs, {"req_to_token": pool, **({"full_to_swa": f2s} if f2s is not None
                                                                            else {})}))
    for f in ("local_query_start_loc", "local_seqused_k", "local_block_table"):
        assert torch.equal(getattr(m, f).cpu()[: ref[f].shape[0]], ref[f]), f


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
@pytest.mark.parametrize("page", [1, 16])
def test_local_fields_eager_captured_and_replayed(page, window_pool):
    # Llama 4's layout: the chunked layers are the window layers (SGLang's window is the chunk there)
    cb = compile_backend("flashattention", CompileOptions(
        max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, page_size=page, sliding_window=C if window_pool else 0,
        window_pool=window_pool, backend=FlashAttentionOptions(attention_chunk=C)))
    pool, slots = paged_pool(ROWS, L, page, seed=3), ROWS * L
    f2s = window_table(ROWS, L, page, seed=4) if window_pool else None
    for bs in SIZES:
        be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
        g = capture(be, batch(bs, bs, slots))
        check(cb, be, batch(bs, bs, slots), bs, pool, page, f2s)
        replay_then_eager(be, g, bs, lambda raw, seed: batch(raw, seed, slots),
                          lambda fb, n, be=be: check(cb, be, fb, n, pool, page, f2s))


def test_local_fields_by_hand():
    """C = 8, one-token pages: a request of 19 tokens is in its third chunk (tokens 16..18: 3 keys, slots 116..118);
    one of 8 fills its first chunk (8 keys); one of 9 starts its second (1 key, slot 308)."""
    pool = torch.zeros(4, 32, dtype=torch.int32)
    pool[1, :20], pool[2, :8], pool[3, :9] = torch.arange(100, 120), torch.arange(200, 208), torch.arange(300, 309)
    cb = compile_backend("flashattention", CompileOptions(max_bs=3, capture_sizes=(3,), max_context_len=32,
                                                          backend=FlashAttentionOptions(attention_chunk=8)))
    be = cb.instantiate(pool)
    seq, rpi = torch.tensor([19, 8, 9], dtype=torch.int32), torch.tensor([1, 2, 3])
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 3, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                          seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=36))
    m = be.forward_metadata
    assert m.local_query_start_loc[:4].tolist() == [0, 1, 2, 3]
    assert m.local_seqused_k[:3].tolist() == [3, 8, 1]
    assert m.local_block_table[0, :3].tolist() == [116, 117, 118]
    assert m.local_block_table[1, :8].tolist() == list(range(200, 208))
    assert m.local_block_table[2, :1].tolist() == [308]
    assert m.cache_seqlens_int32[:3].tolist() == [19, 8, 9]  # the full layers still read everything


def test_local_attention_options_are_checked():
    with pytest.raises(OptionsError, match="attention_chunk must be an int >= 0"):
        FlashAttentionOptions(attention_chunk=-8)
    with pytest.raises(OptionsError, match="not a multiple of the page size 16"):
        compile_backend("flashattention", CompileOptions(max_bs=2, page_size=16, max_context_len=256,
                                                         backend=FlashAttentionOptions(attention_chunk=24)))
    for modes, topk, what in ((("decode", "target_verify"), 4, "not target_verify with topk > 1"),
                              (("decode", "draft_extend"), 1, "not draft_extend")):
        with pytest.raises(OptionsError, match=what):
            compile_backend("flashattention", CompileOptions(max_bs=2, max_context_len=64, modes=modes, topk=topk,
                                                             num_steps=2, num_draft_tokens=4,
                                                             backend=FlashAttentionOptions(attention_chunk=8)))


def items(m, live: int, V: int, P: int) -> list[tuple[int, int, list[int]]]:
    """The batch items the kernel reads of the first ``live`` requests, as (queries, keys, pages), empty items
    (no queries) left out: what SGLang's host code lists."""
    cu, keys = m.local_query_start_loc.tolist(), m.local_seqused_k.tolist()
    out = []
    for i in range(live * V):
        if cu[i + 1] > cu[i]:
            out.append((cu[i + 1] - cu[i], keys[i], m.local_block_table[i, : -(-keys[i] // P)].tolist()))
        else:
            assert keys[i] == 0, (i, "an empty item has keys")
    return out


def twin_items(want, P: int, f2s=None) -> list[tuple[int, int, list[int]]]:
    cu, keys = want.local_query_start_loc.tolist(), want.local_seqused_k.tolist()
    out = []
    for i, k in enumerate(keys):
        pages = want.local_block_table[i].long()
        if f2s is not None:
            pages = f2s[pages * P] // P
        out.append((cu[i + 1] - cu[i], k, pages.tolist()))
    return out


def verify_batch(bs: int, seed: int, slots: int, D: int) -> ForwardBatch:
    """Prefixes whose D drafts start a chunk, end one, or run into the next."""
    g = torch.Generator().manual_seed(seed)
    edges = torch.tensor([1, C - D, C - D + 1, C - 1, C, 2 * C - 2, L - D - 1])
    seq = torch.where(torch.rand(bs, generator=g) < 0.6, edges[torch.randint(0, len(edges), (bs,), generator=g)],
                      torch.randint(1, L - D, (bs,), generator=g)).to(torch.int32)
    rpi = torch.randperm(ROWS - 1, generator=g)[:bs].to(torch.int64) + 1
    return ForwardBatch(ForwardMode.TARGET_VERIFY, bs, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq,
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()),
                        out_cache_loc=torch.randint(1, slots, (bs * D,), generator=g))


@pytest.mark.parametrize("page, window_pool", [(1, False), (16, True)], ids=["page1-one-pool", "page16-window-pool"])
def test_verify_chunks_interleaved_with_decode(page, window_pool):
    """One backend with decode, idle and target verify, each captured at every size; steps interleave the modes,
    replayed at their size or padded into a larger one, or eager at a size never captured; every step's items
    equal the twin's, and the whole padded layout the interpreter's."""
    import random

    D = 6  # with C = 64, a request's drafts run into the next chunk when its prefix ends within 5 of a chunk's end
    V = 2
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, page_size=page, num_draft_tokens=D,
                          sliding_window=C if window_pool else 0, window_pool=window_pool,
                          modes=("decode", "idle", "target_verify"), backend=FlashAttentionOptions(attention_chunk=C))
    cb = compile_backend("flashattention", opts)
    pool, slots = paged_pool(ROWS, L, page, seed=7), ROWS * L
    f2s = window_table(ROWS, L, page, seed=8) if window_pool else None
    be = cb.instantiate(pool, pools={"full_to_swa": f2s} if window_pool else None)
    twin = EagerFlashAttentionDecode(pool, MAX_BS, page_size=page, draft_tokens=D, attention_chunk=C)
    make = {ForwardMode.DECODE: lambda n, seed: batch(n, seed, slots),
            ForwardMode.TARGET_VERIFY: lambda n, seed: verify_batch(n, seed, slots, D)}
    graphs = {(mode, bs): capture(be, make[mode](bs, bs)) for mode in make for bs in SIZES}
    rng, seen, straddled = random.Random(page), set(), 0
    for step in range(24):
        mode = rng.choice(list(make))
        n = rng.choice([1, 2, 3, 4, 5, 7, 8, 0 if step % 7 == 3 else 2])
        fb = make[mode](n, 100 + step) if n else ForwardBatch(ForwardMode.IDLE, 0)
        size = next((s for s in SIZES if s >= max(n, 1)), None)
        how = "eager" if step % 6 == 5 else "replay"
        if how == "eager":
            if not n:
                continue
            be.init_forward_metadata(fb)
            size = n
        else:
            be.init_forward_metadata_out_graph(ReplayView.of(fb, size))
            graphs[(mode if n else ForwardMode.DECODE, size)].replay()
        seen.add((mode if n else "idle", how, size != n))
        if not n:
            continue
        m, per = be.forward_metadata, V if mode is ForwardMode.TARGET_VERIFY else 1
        got = items(m, n, per, page)
        assert got == twin_items(twin.init_forward_metadata(fb), page, f2s), (step, mode)
        straddled += len(got) - n  # a request whose drafts ran into a second chunk
        g = cb.plan(mode, size).graph
        ref = eval_graph(g, padded_inputs(g, fb, size, {"req_to_token": pool, **({"full_to_swa": f2s}
                                                                                  if f2s is not None else {})}))
        for f in ("local_query_start_loc", "local_seqused_k", "local_block_table"):
            assert torch.equal(getattr(m, f).cpu()[: ref[f].shape[0]], ref[f]), (step, f)
    assert straddled, "no verify step ran into a second chunk"
    assert {h for _, h, _ in seen} == {"replay", "eager"} and any(p for *_, p in seen)


def test_verify_chunks_by_hand():
    """C = 8, one-token pages, D = 3. A prefix of 6: its drafts are tokens 6, 7 (the first chunk: 2 queries over 8
    keys) and 8 (the second: 1 query over 1 key, slot 108). A prefix of 16: tokens 16..18, the third chunk (3
    queries, 3 keys). A prefix of 5: tokens 5..7, the first chunk (3 queries, 8 keys). Two items per request, the
    unused second one empty."""
    pool = torch.zeros(4, 32, dtype=torch.int32)
    pool[1], pool[2], pool[3] = torch.arange(100, 132), torch.arange(200, 232), torch.arange(300, 332)
    cb = compile_backend("flashattention", CompileOptions(
        max_bs=3, capture_sizes=(3,), max_context_len=32, num_draft_tokens=3, modes=("decode", "target_verify"),
        backend=FlashAttentionOptions(attention_chunk=8)))
    be = cb.instantiate(pool)
    seq, rpi = torch.tensor([6, 16, 5], dtype=torch.int32), torch.tensor([1, 2, 3])
    be.init_forward_metadata(ForwardBatch(ForwardMode.TARGET_VERIFY, 3, req_pool_indices=rpi,
                                          req_pool_indices_cpu=rpi, seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=27))
    m = be.forward_metadata
    assert m.local_query_start_loc.tolist() == [0, 2, 3, 6, 6, 9, 9]
    assert m.local_seqused_k.tolist() == [8, 1, 3, 0, 8, 0]
    assert m.local_block_table[0, :8].tolist() == list(range(100, 108))
    assert m.local_block_table[1, :1].tolist() == [108]
    assert m.local_block_table[2, :3].tolist() == [216, 217, 218]
    assert m.local_block_table[4, :8].tolist() == list(range(300, 308))
    assert m.cache_seqlens_int32.tolist() == [9, 19, 8]  # the other layers read every key
