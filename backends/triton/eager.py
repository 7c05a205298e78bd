"""Eager twin of backends/triton/spec.py, the way engines write it: persistent
indptr, a fresh kv_indices sized by the host-known sum, and the split
heuristic in torch on device."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from ..common import gather_kv_indices


class EagerTritonDecode:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, max_kv_splits: int = 8, draft_tokens: int = 4,
                 sm_count: int = 132, num_heads: int = 32, num_kv_heads: int = 8, sliding_window: int = 0,
                 full_to_swa: torch.Tensor | None = None):
        self.req_to_token, self.max_kv_splits, self.D = req_to_token, max_kv_splits, draft_tokens
        # a sliding window of this many tokens (0: none); its KV in a pool of its own when ``full_to_swa`` maps the
        # full pool's slots to that pool's
        self.window, self.full_to_swa = sliding_window, full_to_swa
        group = num_heads // num_kv_heads  # thread blocks per request in the split-KV decode kernel
        self.sm_count, self.blocks = sm_count, num_heads if group == 1 else -(-num_heads // min(16, group))
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs = fb.batch_size
        seq = fb.seq_lens[:bs]
        if fb.forward_mode.is_draft_extend():  # keys: the tokens before the extension
            kv = (seq - fb.extend_seq_lens[:bs]).clamp(min=0).to(torch.int32)
            indptr = torch.nn.functional.pad(torch.cumsum(kv, 0, dtype=torch.int32), (1, 0))
            keys = (fb.seq_lens_cpu[:bs] - fb.extend_seq_lens_cpu[:bs]).clamp(min=0)
            total = int(keys.sum())
            return self.window_of(fb, keys, SimpleNamespace(
                qo_indptr=torch.arange(0, (bs + 1) * self.D, self.D, dtype=torch.int32, device=seq.device),
                kv_indptr=indptr, max_extend_len=self.D,
                kv_indices=gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], kv, indptr, total)))
        self.kv_indptr[1 : bs + 1] = torch.cumsum(seq, 0)
        kv_indptr = self.kv_indptr[: bs + 1]
        total = int(fb.seq_lens_cpu[:bs].sum())
        kv_indices = gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], seq, kv_indptr, total)
        if fb.forward_mode.is_target_verify():  # kv over the prefix only; the drafts' K/V come separately
            D = self.D
            return self.window_of(fb, fb.seq_lens_cpu[:bs], SimpleNamespace(
                qo_indptr=torch.arange(0, (bs + 1) * D, D, dtype=torch.int32, device=seq.device),
                kv_indptr=kv_indptr, kv_indices=kv_indices, max_extend_len=D,
                mask_indptr=torch.nn.functional.pad(torch.cumsum((seq + D) * D, 0, dtype=torch.int32), (1, 0))))
        splits, uneven = self.splits(seq)
        out = SimpleNamespace(kv_indptr=kv_indptr, kv_indices=kv_indices, uneven_batch=uneven, num_kv_splits=splits,
                              max_kv_splits=self.max_kv_splits)
        return self.window_of(fb, fb.seq_lens_cpu[:bs], out)

    def window_of(self, fb, keys: torch.Tensor, out: SimpleNamespace) -> SimpleNamespace:
        """``out`` with the window layers' fields (when there is a window), request by request: of each row's
        ``keys`` cached tokens the last min(keys, W) slots (translated to the window pool's where it has one, and
        the step's write slots with them); decode's split counts over them, or verify's and draft extend's
        first window column per request."""
        if not self.window:
            return out
        bs = fb.batch_size
        rows, ends = fb.req_pool_indices[:bs].tolist(), [int(k) for k in keys]
        parts = [self.req_to_token[r, e - min(e, self.window): e].long() for r, e in zip(rows, ends, strict=True)]
        lens = torch.tensor([p.numel() for p in parts], dtype=torch.int32)
        out.window_kv_indptr = torch.cat([lens.new_zeros(1), lens.cumsum(0)]).to(torch.int32)
        idx = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        if self.full_to_swa is not None:
            idx = self.full_to_swa[idx]
            out.swa_out_cache_loc = self.full_to_swa[fb.out_cache_loc.long()]
        out.window_kv_indices = idx
        if fb.forward_mode.is_decode_or_idle():
            out.window_num_kv_splits = self.splits(lens.to(fb.seq_lens.device))[0]
        else:
            out.window_kv_offsets = torch.tensor(ends, dtype=torch.int32) - lens
        return out

    def splits(self, seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(num_kv_splits, uneven_batch) of the engine's heuristic over the lengths ``seq``."""
        bs = seq.shape[0]
        zero = torch.zeros((), dtype=torch.int32, device=seq.device)
        if self.sm_count == 0:  # the engine's static split
            return torch.full_like(seq, self.max_kv_splits, dtype=torch.int32), zero
        if bs == 0:
            return seq.clone(), zero
        longest, shortest = seq.max(), seq.min()
        shortest = torch.where(longest * 8 < shortest * 10, longest, shortest)
        uneven = (shortest < longest).to(torch.int32)
        splits = torch.clamp(-(-longest // shortest), max=self.max_kv_splits)
        chunk = -(-longest // splits)
        # enough splits to fill the SMs: log2 of the longest sequence in 64-token units, in float32
        cores = (torch.log2(longest.float() / 64.0).clamp(min=1.0) * self.sm_count).int()
        splits2 = torch.clamp(-(-cores // (bs * self.blocks)), max=self.max_kv_splits)
        chunk2 = -(-longest // splits2)
        return torch.maximum(-(-seq // chunk), -(-seq // chunk2)).to(torch.int32), uneven
