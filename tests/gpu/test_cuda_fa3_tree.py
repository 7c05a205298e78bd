"""FA3's EAGLE topk > 1 metadata on real CUDA graphs: the tree verify's expansion (read from the drafter's mask
in the plan's buffer) and the drafter's branches (read from the request table), captured short, replayed long
and padded, against the eager twins on the host."""

from types import SimpleNamespace

import pytest
import torch

from attnmeta.backends.flashattention.eager import EagerFlashAttentionTreeDraft, EagerFlashAttentionTreeVerify
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import CudaGraph, ReplayView
from tests.batches import make_batch
from tests.runtime.test_fa3_tree_verify import K, S, draft_batch, paged_pool, tree_mask

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
M = ForwardMode
L, ROWS, MAX_BS, D = 640, 12, 8, 6


def cuda(fb):
    dev = torch.device("cuda")
    for f in ("req_pool_indices", "seq_lens", "out_cache_loc"):
        if getattr(fb, f, None) is not None:
            setattr(fb, f, getattr(fb, f).to(dev))
    return fb


def captured(be, fb) -> CudaGraph:
    be.init_forward_metadata_out_graph(fb, in_capture=True)
    be.init_forward_metadata_in_graph(fb)  # warm-up: Triton compiles before the capture
    torch.cuda.synchronize()
    g = CudaGraph()
    with g.capture():
        be.init_forward_metadata_in_graph(fb)
    return g


@pytest.mark.parametrize("P", [1, 16])
def test_tree_verify_on_cuda(P):
    pool = paged_pool(ROWS, L, P, seed=P)
    cb = compile_backend("flashattention", CompileOptions(modes=(M.TARGET_VERIFY,), max_bs=MAX_BS, capture_sizes=(8,),
                                                          max_context_len=L, page_size=P, num_draft_tokens=D, topk=4,
                                                          num_steps=3))
    be, g = cb.instantiate(pool.cuda(), device=torch.device("cuda")), torch.Generator().manual_seed(P)
    graph = captured(be, cuda(make_batch(8, L - D, ROWS, seed=1, mode=M.TARGET_VERIFY, max_len=3)))
    for seed, raw in ((2, 8), (3, 5)):
        fb = make_batch(raw, L - D, ROWS, seed=seed, mode=M.TARGET_VERIFY)
        mask = tree_mask(fb.seq_lens_cpu.tolist(), D, g)
        be.bound(M.TARGET_VERIFY, 8).field("custom_mask")[: mask.numel()].copy_(mask.cuda())  # the drafter writes it
        be.init_forward_metadata_out_graph(ReplayView.of(cuda(fb), 8))
        graph.replay()
        torch.cuda.synchronize()
        m = be.forward_metadata
        want = EagerFlashAttentionTreeVerify(pool, MAX_BS, P, draft_tokens=D).init_forward_metadata(SimpleNamespace(
            batch_size=raw, seq_lens=fb.seq_lens.cpu(), seq_lens_cpu=fb.seq_lens_cpu,
            req_pool_indices=fb.req_pool_indices.cpu(), custom_mask=mask))
        assert torch.equal(m.expand_cache_seqlens_int32[: raw * D].cpu(), want.expand_cache_seqlens_int32)
        assert torch.equal(m.expand_page_table[: raw * D].cpu(), want.expand_page_table)
        assert torch.equal(m.expand_cu_seqlens_k[: raw * D + 1].cpu(), want.expand_cu_seqlens_k)
        assert torch.equal(m.cache_seqlens_int32[:raw].cpu(), want.cache_seqlens_int32)


@pytest.mark.parametrize("P", [1, 16])
def test_tree_draft_on_cuda(P):
    pool = paged_pool(ROWS, L, P, seed=P)
    cb = compile_backend("flashattention_draft", CompileOptions(modes=(M.DECODE,), max_bs=MAX_BS, capture_sizes=(8,),
                                                                max_context_len=L, page_size=P, num_draft_tokens=D,
                                                                topk=K, num_steps=S))
    be = cb.instantiate(pool.cuda(), device=torch.device("cuda"))
    graph = captured(be, cuda(draft_batch(8, P, 1, pool)))
    for seed, raw in ((2, 8), (3, 5)):
        fb = draft_batch(raw, P, seed, pool)
        want = EagerFlashAttentionTreeDraft(pool, MAX_BS, P, num_steps=S, topk=K).init_forward_metadata(fb)
        be.init_forward_metadata_out_graph(ReplayView.of(cuda(fb), 8))
        graph.replay()
        torch.cuda.synchronize()
        m = be.forward_metadata
        assert torch.equal(m.cache_seqlens_int32[:raw].cpu(), want.cache_seqlens_int32)
        for s in range(S - 1):
            lens = want.step(s).expand_cache_seqlens_int32
            assert torch.equal(m.step(s).expand_cache_seqlens_int32[: raw * K].cpu(), lens)
            for r, k in enumerate(lens.tolist()):
                n = -(-k // P)
                assert torch.equal(m.step(s).expand_page_table[r, :n].cpu(), want.step(s).expand_page_table[r, :n])
