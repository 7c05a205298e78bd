"""The hand-written eager twin of backends/flashmla/spec.py, the way SGLang's FlashMLABackend prepares a
step: a page table of 64-token pages (the rest of each row left as it was: -1 here), int32 key
lengths, and FlashMLA's tile schedule of those lengths (``planners.flashmla.schedule``, the
scheduler's source in Python, line by line: not the kernel the compiled backend launches)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attnmeta.backends.flashmla.planner import META_WORDS, SCHEDULED, num_sm_parts, schedule

PAGE = 64


class EagerFlashMLA:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, draft_tokens: int = 4, sm_count: int = 132,
                 num_heads: int = 32):
        self.req_to_token, self.D, self.sm_count, self.heads = req_to_token, draft_tokens, sm_count, num_heads
        self.table = torch.full((max_bs, (req_to_token.shape[1] + PAGE) // PAGE), -1, dtype=torch.int32,
                                device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs, D, mode = fb.batch_size, self.D, fb.forward_mode
        seq = fb.seq_lens_cpu[:bs].tolist()
        if mode.is_target_verify():
            keys = [s + D for s in seq]
        elif mode.is_draft_extend():
            keys = [s - e + D for s, e in zip(seq, fb.extend_seq_lens_cpu[:bs].tolist(), strict=True)]
        else:
            keys = seq
        for i, (row, n) in enumerate(zip(fb.req_pool_indices[:bs].tolist(), keys, strict=True)):
            pages = -(-n // PAGE)
            self.table[i, :pages] = self.req_to_token[row, torch.arange(pages, device=self.table.device) * PAGE] // PAGE
        q = D if mode.is_target_verify() or mode.is_draft_extend() else 1
        parts = num_sm_parts(self.sm_count, q * self.heads)
        meta, splits = schedule(keys, parts)
        words = torch.zeros(parts, META_WORDS, dtype=torch.int32)
        words[:, :SCHEDULED] = torch.tensor(meta, dtype=torch.int32)
        dev = self.req_to_token.device
        return SimpleNamespace(block_kv_indices=self.table[:bs], cache_seqlens=torch.tensor(keys, dtype=torch.int32),
                               tile_scheduler_metadata=words.to(dev),
                               num_splits=torch.tensor(splits, dtype=torch.int32).to(dev))
