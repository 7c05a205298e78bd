"""The hand-written eager twin of backends/trtllm_mla/spec.py, the way SGLang's TRTLLMMLABackend prepares a
step: a persistent page table at the padded width whose rows get the pages each length covers
(the rest left as they were: -1 here), and the int32 key lengths."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .spec import padded_pages


class EagerTRTLLMMLA:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, page_size: int = 64, draft_tokens: int = 4):
        self.req_to_token, self.P, self.D = req_to_token, page_size, draft_tokens
        width = padded_pages(req_to_token.shape[1], page_size)
        self.table = torch.full((max_bs, width), -1, dtype=torch.int32, device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs, P, D = fb.batch_size, self.P, self.D
        mode = fb.forward_mode
        keys = (fb.seq_lens[:bs] + (D if mode.is_target_verify() else 0)).to(torch.int32)
        keys_host = fb.seq_lens_cpu[:bs] + (D if mode.is_target_verify() else 0)
        for i, (row, n) in enumerate(zip(fb.req_pool_indices[:bs].tolist(), keys_host.tolist(), strict=True)):
            pages = -(-n // P)
            self.table[i, :pages] = self.req_to_token[row, torch.arange(pages, device=keys.device) * P] // P
        out = SimpleNamespace(block_kv_indices=self.table[:bs], seq_lens_k=keys)
        if mode.is_draft_extend():
            out.cu_seqlens_q = torch.arange(0, (bs + 1) * D, D, dtype=torch.int32, device=keys.device)
            out.seq_lens_q = torch.full((bs,), D, dtype=torch.int32, device=keys.device)
        return out
