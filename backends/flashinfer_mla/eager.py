"""The hand-written eager twin of backends/flashinfer_mla/spec.py, written the way SGLang's
FlashInferMLAAttnBackend prepares an MLA step: a persistent kv indptr, a fresh ``kv_indices`` sized
by the host-known token sum, and the host arrays plan() reads (query indptr, kv indptr, kv
lengths). The benchmark baseline and a second, independent oracle."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..common import gather_kv_indices


class EagerFlashInferMLA:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, draft_tokens: int = 4):
        self.req_to_token, self.D = req_to_token, draft_tokens
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs, mode = fb.batch_size, fb.forward_mode
        verify = mode.is_target_verify()
        q = self.D if verify or mode.is_draft_extend() else 1  # query rows per request
        extra = self.D if verify else 0  # verify attends the drafts after the prefix
        kv_lens = (fb.seq_lens[:bs] + extra).to(torch.int32)
        kv_lens_host = (fb.seq_lens_cpu[:bs] + extra).to(torch.int32)
        self.kv_indptr[1 : bs + 1] = torch.cumsum(kv_lens, 0)
        kv_indptr = self.kv_indptr[: bs + 1]
        total = int(kv_lens_host.sum())  # host mirror: no device sync
        kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr_host[1:] = torch.cumsum(kv_lens_host, 0)
        qo = torch.arange(0, (bs + 1) * q, q, dtype=torch.int32)
        return SimpleNamespace(
            qo_indptr=qo.to(kv_lens.device), kv_indptr=kv_indptr, kv_lens=kv_lens,
            kv_indices=gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], kv_lens, kv_indptr, total),
            qo_indptr_host=qo, kv_indptr_host=kv_indptr_host, kv_lens_host=kv_lens_host)
