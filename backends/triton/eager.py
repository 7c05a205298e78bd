"""Eager twin of backends/triton/spec.py, the way engines write it: persistent
indptr, a fresh kv_indices sized by the host-known sum, and the split
heuristic in torch on device."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..common import gather_kv_indices


class EagerTritonDecode:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, max_kv_splits: int = 8, draft_tokens: int = 4,
                 sm_count: int = 132, num_heads: int = 32, num_kv_heads: int = 8):
        self.req_to_token, self.max_kv_splits, self.D = req_to_token, max_kv_splits, draft_tokens
        group = num_heads // num_kv_heads  # thread blocks per request in the split-KV decode kernel
        self.sm_count, self.blocks = sm_count, num_heads if group == 1 else -(-num_heads // min(16, group))
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs = fb.batch_size
        seq = fb.seq_lens[:bs]
        if fb.forward_mode.is_draft_extend():  # keys: the tokens before the extension
            kv = (seq - fb.extend_seq_lens[:bs]).clamp(min=0).to(torch.int32)
            indptr = torch.nn.functional.pad(torch.cumsum(kv, 0, dtype=torch.int32), (1, 0))
            total = int((fb.seq_lens_cpu[:bs] - fb.extend_seq_lens_cpu[:bs]).clamp(min=0).sum())
            return SimpleNamespace(
                qo_indptr=torch.arange(0, (bs + 1) * self.D, self.D, dtype=torch.int32, device=seq.device),
                kv_indptr=indptr, max_extend_len=self.D,
                kv_indices=gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], kv, indptr, total))
        self.kv_indptr[1 : bs + 1] = torch.cumsum(seq, 0)
        kv_indptr = self.kv_indptr[: bs + 1]
        total = int(fb.seq_lens_cpu[:bs].sum())
        kv_indices = gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], seq, kv_indptr, total)
        if fb.forward_mode.is_target_verify():  # kv over the prefix only; the drafts' K/V come separately
            D = self.D
            return SimpleNamespace(
                qo_indptr=torch.arange(0, (bs + 1) * D, D, dtype=torch.int32, device=seq.device),
                kv_indptr=kv_indptr, kv_indices=kv_indices, max_extend_len=D,
                mask_indptr=torch.nn.functional.pad(torch.cumsum((seq + D) * D, 0, dtype=torch.int32), (1, 0)))
        zero = torch.zeros((), dtype=torch.int32, device=seq.device)
        if self.sm_count == 0:  # the engine's static split
            return SimpleNamespace(kv_indptr=kv_indptr, kv_indices=kv_indices, uneven_batch=zero,
                                   num_kv_splits=torch.full_like(seq, self.max_kv_splits, dtype=torch.int32),
                                   max_kv_splits=self.max_kv_splits)
        if bs == 0:
            return SimpleNamespace(kv_indptr=kv_indptr, kv_indices=kv_indices, num_kv_splits=seq.clone(),
                                   uneven_batch=zero, max_kv_splits=self.max_kv_splits)
        longest, shortest = seq.max(), seq.min()
        shortest = torch.where(longest * 8 < shortest * 10, longest, shortest)
        uneven = (shortest < longest).to(torch.int32)
        splits = torch.clamp(-(-longest // shortest), max=self.max_kv_splits)
        chunk = -(-longest // splits)
        # enough splits to fill the SMs: log2 of the longest sequence in 64-token units, in float32
        cores = (torch.log2(longest.float() / 64.0).clamp(min=1.0) * self.sm_count).int()
        splits2 = torch.clamp(-(-cores // (bs * self.blocks)), max=self.max_kv_splits)
        chunk2 = -(-longest // splits2)
        return SimpleNamespace(kv_indptr=kv_indptr, kv_indices=kv_indices, uneven_batch=uneven,
                               num_kv_splits=torch.maximum(-(-seq // chunk), -(-seq // chunk2)).to(torch.int32),
                               max_kv_splits=self.max_kv_splits)
