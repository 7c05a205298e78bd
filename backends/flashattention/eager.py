"""Eager twin of backends/flashattention/spec.py, the way engines write it: the
page table gathered at the width of the longest sequence (a host max)."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import torch

from attnmeta.runtime.metadata import Metadata, step_prefix


class EagerFlashAttentionDecode:
    strided_extend = False  # draft extend's queries: each request's accepted tokens

    def __init__(self, req_to_token: torch.Tensor, max_bs: int, page_size: int = 1, draft_tokens: int = 4):
        self.req_to_token, self.page_size, self.D = req_to_token, page_size, draft_tokens
        L = req_to_token.shape[1]
        self.strided = torch.arange(0, L, page_size, device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs, P = fb.batch_size, self.page_size
        verify = fb.forward_mode.is_target_verify()
        spec = verify or fb.forward_mode.is_draft_extend()
        T = self.D if spec else 1  # query tokens per request; in verify the D drafts' keys follow the prefix
        extra = self.D if verify else 0
        seq = fb.seq_lens[:bs] + extra
        cu_k = torch.nn.functional.pad(torch.cumsum(seq, 0, dtype=torch.int32), (1, 0))
        max_k = int(fb.seq_lens_cpu[:bs].max()) + extra if bs else 0  # host mirror: no device sync
        n = -(-max_k // P)
        rows = fb.req_pool_indices[:bs].long()
        page_table = (self.req_to_token[rows[:, None], self.strided[:n]] // P).to(torch.int32)
        cu_q = torch.arange(0, (bs + 1) * T, T, dtype=torch.int32, device=seq.device)
        if fb.forward_mode.is_draft_extend() and not self.strided_extend:  # queries: each request's accepted tokens
            cu_q = torch.nn.functional.pad(torch.cumsum(fb.extend_seq_lens[:bs], 0, dtype=torch.int32), (1, 0))
        return SimpleNamespace(cache_seqlens_int32=seq.to(torch.int32), cu_seqlens_k=cu_k, cu_seqlens_q=cu_q,
                               page_table=page_table, max_seq_len_q=T, max_seq_len_k=max_k)


class EagerTRTLLMMHA(EagerFlashAttentionDecode):
    """TRT-LLM MHA's step, as SGLang's TRTLLMHAAttnBackend computes it: FlashAttention's, with draft
    extend's queries T per request (strided), whatever each request accepted."""

    strided_extend = True


class EagerFlashAttentionDraft:
    """Draft decode steps, the way a multi-step draft backend loops over its steps."""

    def __init__(self, req_to_token: torch.Tensor, max_bs: int, page_size: int = 1, num_steps: int = 3):
        self.step = EagerFlashAttentionDecode(req_to_token, max_bs, page_size)
        self.num_steps = num_steps

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        out = Metadata(max_seq_len_q=1)
        for i in range(self.num_steps):
            m = self.step.init_forward_metadata(attrs.evolve(fb, seq_lens=fb.seq_lens + i + 1,
                                                             seq_lens_cpu=fb.seq_lens_cpu + i + 1))
            out.cu_seqlens_q = m.cu_seqlens_q
            for field in ("cache_seqlens_int32", "cu_seqlens_k", "page_table"):
                setattr(out, step_prefix(i) + field, getattr(m, field))
        return out
