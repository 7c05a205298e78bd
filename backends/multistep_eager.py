"""Eager twin of the MultiStep wrapper, the way a multi-step draft backend is written: one
inner backend per step, and with topk > 1 the draft kv indices built by one pass over
(step, request, branch) that writes each branch's prefix and drafted slots at its offset."""

from __future__ import annotations

import attrs
import torch

from attnmeta.runtime.metadata import Metadata, step_prefix


def draft_kv_indices(req_to_token, rpi: list[int], seq: list[int], it: int, topk: int, num_steps: int,
                     page_size: int) -> torch.Tensor:
    """Step with ``it`` drafted tokens: request b's branch k starts at
    K*sum(seq[:b]) + b*it*K + k*(seq[b] + it) and holds the prefix, then the branch's ``it`` slots."""
    K, S, P = topk, num_steps, page_size
    out = torch.zeros(K * sum(seq) + len(seq) * K * it, dtype=req_to_token.dtype, device=req_to_token.device)
    before = 0
    for b, (r, n) in enumerate(zip(rpi, seq, strict=True)):
        for k in range(K):
            at = K * before + b * it * K + k * (n + it)
            out[at : at + n] = req_to_token[r, :n]
            if P == 1 or K == 1:
                first = n + k * S
            else:  # a branch's drafts start on its own pages, at the prefix's offset into a page
                first = n // P * P + k * ((n % P + S + P - 1) // P) * P + n % P
            out[at + n : at + n + it] = req_to_token[r, first : first + it]
        before += n
    return out


class EagerMultiStep:
    """One inner backend per step, as engines do: each keeps its own persistent buffers (sized
    for max_bs * topk rows)."""

    def __init__(self, make_inner, num_steps: int, topk: int = 1, page_size: int = 1, per_round=()):
        self.steps = [make_inner() for _ in range(num_steps)]
        self.S, self.K, self.P, self.per_round = num_steps, topk, page_size, per_round

    def init_forward_metadata(self, fb) -> Metadata:
        out, K, bs = Metadata(), self.K, fb.batch_size
        rep = (lambda x: x[:bs].repeat_interleave(K)) if K > 1 else (lambda x: x[:bs])
        round_ = {}
        if self.per_round:  # planned once over the prefix, the same for every step
            prefix = attrs.evolve(fb, batch_size=bs * K, seq_lens=rep(fb.seq_lens), seq_lens_cpu=rep(fb.seq_lens_cpu),
                                  req_pool_indices=rep(fb.req_pool_indices), seq_lens_sum=None)
            meta = self.steps[0].init_forward_metadata(prefix)
            round_ = {f: getattr(meta, f) for f in self.per_round if hasattr(meta, f)}
        for s, inner in enumerate(self.steps):
            it = s + 1
            step = attrs.evolve(fb, batch_size=bs * K, seq_lens=rep(fb.seq_lens) + it,
                                seq_lens_cpu=rep(fb.seq_lens_cpu) + it, req_pool_indices=rep(fb.req_pool_indices),
                                seq_lens_sum=None)
            meta = inner.init_forward_metadata(step)
            if K > 1:  # the inner backend reads kv_indices the drafter laid out
                meta.kv_indices = draft_kv_indices(inner.req_to_token, fb.req_pool_indices[:bs].tolist(),
                                                   fb.seq_lens_cpu[:bs].tolist(), it, K, self.S, self.P)
            for field, v in (vars(meta) | round_).items():
                setattr(out, step_prefix(s) + field, v)
        return out
