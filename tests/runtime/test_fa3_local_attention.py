"""FlashAttention's chunked local attention (Llama 4's iRoPE layers; ``FlashAttentionOptions.attention_chunk`` = C):
in decode each request's current chunk is one batch item, its keys that chunk's tokens so far and its pages that
chunk's, from the full pool's page table or, where the chunked layers keep their KV in a pool of their own, the
window pool's. Compiled eager, captured and replayed (padded, idle) steps against the eager twin (request by
request), the reference interpreter, and a hand-computed case; bad options and other modes are refused."""

import pytest
import torch

from attnmeta.backends.flashattention.eager import EagerFlashAttentionDecode
from attnmeta.backends.flashattention.spec import FlashAttentionOptions
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import ForwardBatch
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
    with pytest.raises(OptionsError, match="decode only, not target_verify"):
        compile_backend("flashattention", CompileOptions(max_bs=2, max_context_len=64, modes=("decode",
                                                         "target_verify"), backend=FlashAttentionOptions(
                                                             attention_chunk=8)))
