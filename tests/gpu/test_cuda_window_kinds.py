"""Real CUDA graphs for the window layouts FlashInfer and FlashAttention plan beside triton's: FlashInfer's window
wrapper (decode: the last min(seq, W + 1) slots, in the full pool or translated into a window pool with the write
slots) and FlashAttention's chunked local attention (decode: each request's current chunk), captured short,
replayed long and padded, == the eager twins (request by request)."""

import pytest
import torch

from attnmeta.backends.flashattention.eager import EagerFlashAttentionDecode
from attnmeta.backends.flashattention.spec import FlashAttentionOptions
from attnmeta.backends.flashinfer.eager import EagerFlashInferDecode
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView
from tests.batches import capture_on_cuda, paged_pool, spec_step, window_table
from tests.oracles import assert_metadata_equal, padded

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS, MAX_BS, W, C = 1024, 40, 32, 100, 256
DECODE = ForwardMode.DECODE


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
def test_flashinfer_window_wrapper_on_cuda(window_pool):
    dev = torch.device("cuda")
    pool, slots = paged_pool(ROWS, L, 1, seed=1).to(dev), ROWS * L
    f2s = window_table(ROWS, L, 1, seed=2).to(dev) if window_pool else None
    cb = compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=(8, 32), max_context_len=L,
                                                      sliding_window=W, window_pool=window_pool))
    be = cb.instantiate(pool, device=dev, pools={"full_to_swa": f2s} if window_pool else None)
    twin = EagerFlashInferDecode(pool, MAX_BS, sliding_window=W, full_to_swa=f2s)
    for bs in (32, 8):
        g = capture_on_cuda(be, bs, L, ROWS, DECODE, 1, dev)
        for seed, raw in [(3, bs), (4, bs - 3)]:  # lengths past the window, and padding
            fb = spec_step(raw, L, ROWS, seed, DECODE, 1, slots, 1, dev)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            torch.cuda.synchronize()
            full = padded(fb, bs, DECODE, 1)
            ref = twin.init_forward_metadata(full)
            assert ("swa_out_cache_loc" in vars(ref)) is window_pool
            assert_metadata_equal(be.forward_metadata, ref, full.seq_lens_cpu)


@pytest.mark.parametrize("page", [1, 16])
def test_fa3_chunked_local_attention_on_cuda(page):
    dev = torch.device("cuda")
    pool, slots = paged_pool(ROWS, L, page, seed=5).to(dev), ROWS * L
    cb = compile_backend("flashattention", CompileOptions(max_bs=MAX_BS, capture_sizes=(8, 32), max_context_len=L,
                                                          page_size=page,
                                                          backend=FlashAttentionOptions(attention_chunk=C)))
    be = cb.instantiate(pool, device=dev)
    twin = EagerFlashAttentionDecode(pool, MAX_BS, page_size=page, attention_chunk=C)
    for bs in (32, 8):
        g = capture_on_cuda(be, bs, L, ROWS, DECODE, 1, dev)
        for seed, raw in [(6, bs), (7, bs - 3)]:
            fb = spec_step(raw, L, ROWS, seed, DECODE, 1, slots, 1, dev)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            torch.cuda.synchronize()
            ref, m = twin.init_forward_metadata(padded(fb, bs, DECODE, 1)), be.forward_metadata
            assert m.local_seqused_k[:raw].tolist() == ref.local_seqused_k[:raw].tolist()
            assert m.local_query_start_loc[: bs + 1].tolist() == ref.local_query_start_loc.tolist()
            for i in range(raw):
                pages = ref.local_block_table[i].tolist()
                assert m.local_block_table[i, : len(pages)].tolist() == pages, (bs, raw, i)
