"""Models for tests, demos and benchmarks: attention over static query/output buffers that reads a
backend's metadata the way an engine's model does (captured with it), for decode and for the
EAGLE drafter's steps."""

from __future__ import annotations

from typing import Protocol

import torch

from attnmeta.compiler.lowering.triton_kernels import torch_on

from .attention import _attend, mla_decode_attention, paged_decode_attention, paged_decode_attention_pt


class Model(Protocol):
    """What the runners drive: static query and output buffers a captured graph reads and writes,
    ``prepare`` (this step's queries into ``q``, padded rows zeroed) and ``forward`` (attention over
    the backend's ``forward_metadata``, into ``out``; recorded by a graph runner)."""

    q: torch.Tensor
    out: torch.Tensor

    def prepare(self, q: torch.Tensor, bs: int) -> None: ...

    def forward(self, meta, bs: int) -> torch.Tensor: ...


class DecodeModel:
    """The captured 'model': attention over static q/out buffers using the backend's metadata,
    by whichever kernel reads that backend's fields: the Triton split-KV kernel for
    ``num_kv_splits``, page-table attention for ``page_table``, else indptr/indices attention."""

    def __init__(self, k_cache, v_cache, max_bs: int, max_len: int, page_size: int = 1, max_kv_splits: int = 8,
                 q_heads: int | None = None, xqa=None):
        self.k_cache, self.v_cache, self.max_len, self.page_size = k_cache, v_cache, max_len, page_size
        self.xqa = xqa  # a FlashInfer XQADecode: reads a page table with no planner (page-table backends)
        H, Dh = k_cache.shape[1:]  # query heads default to the KV heads; more is grouped-query attention
        self.q = torch.zeros(max_bs, q_heads or H, Dh, dtype=k_cache.dtype, device=k_cache.device)
        self.out = torch.zeros_like(self.q)
        self._triton = None
        self._splits = max_kv_splits

    def prepare(self, q: torch.Tensor, bs: int) -> None:
        n = q.shape[0]
        self.q[:n].copy_(q, non_blocking=True)
        self.q[n:bs].zero_()

    def forward(self, meta, bs: int) -> torch.Tensor:
        q, out = self.q[:bs], self.out[:bs]
        if hasattr(getattr(meta, "plan", None), "run"):  # a FlashInfer wrapper planned this step
            from .flashinfer_attention import run_decode

            return run_decode(meta.plan, q, self.k_cache, self.v_cache, out)
        if hasattr(meta, "num_kv_splits") and not torch_on(q):  # the split-KV Triton kernel (torch: below)
            if self._triton is None:
                from .triton_attention import TritonDecodeAttention

                self._triton = TritonDecodeAttention(self.q.shape[0], q.shape[1], q.shape[2], self._splits, q.device)
            return self._triton(q, self.k_cache, self.v_cache, meta.kv_indptr, meta.kv_indices, meta.num_kv_splits,
                                out)
        if hasattr(meta, "page_table") and self.xqa is not None:
            return self.xqa(q, self.k_cache, self.v_cache, meta.page_table, meta.cache_seqlens_int32, self.page_size,
                            self.max_len, out)
        if hasattr(meta, "page_table"):
            return paged_decode_attention_pt(q, self.k_cache, self.v_cache, meta.page_table[:bs],
                                             meta.cache_seqlens_int32[:bs], self.page_size, self.max_len, out=out)
        return paged_decode_attention(q, self.k_cache, self.v_cache, meta.kv_indptr, meta.kv_indices,
                                      self.max_len, out=out)


class DraftModel(DecodeModel):
    """Attention once per draft step, each reading its own step's metadata; outputs summed, as a
    stand-in for the drafter's per-step forward. With ``topk`` K > 1, q and out hold K branches
    per request (``[bs, K, H, Dh]``), the rows ``b*K + k`` the MultiStep metadata describes."""

    def __init__(self, k_cache, v_cache, max_bs: int, max_len: int, num_steps: int, topk: int = 1,
                 q_heads: int | None = None):
        super().__init__(k_cache, v_cache, max_bs, max_len, q_heads=q_heads)
        self.num_steps, self.topk = num_steps, topk
        if topk > 1:
            self.q = self.q[:, None].repeat(1, topk, 1, 1).zero_()
            self.out = torch.zeros_like(self.q)
        rows = self.q.reshape(-1, *self.q.shape[-2:]).shape
        self.step_out = torch.zeros(num_steps, *rows, dtype=self.q.dtype, device=self.q.device)

    def forward(self, meta, bs: int) -> torch.Tensor:
        n = bs * self.topk
        q, out = self.q[:bs].reshape(n, *self.q.shape[-2:]), self.out[:bs].view(n, *self.q.shape[-2:])
        for s in range(self.num_steps):
            step = meta.step(s)  # step s's fields (the multi-step spec's step<s>_ ones)
            plan = getattr(step, "plan", None)
            if hasattr(plan, "run"):  # a FlashInfer wrapper planned this step
                from .flashinfer_attention import run_decode

                run_decode(plan, q, self.k_cache, self.v_cache, self.step_out[s, :n])
                continue
            if hasattr(step, "page_table"):  # FlashAttention's drafter: a page table per step
                paged_decode_attention_pt(q, self.k_cache, self.v_cache, step.page_table[:n],
                                          step.cache_seqlens_int32[:n], self.page_size, self.max_len,
                                          out=self.step_out[s, :n])
                continue
            paged_decode_attention(q, self.k_cache, self.v_cache, step.kv_indptr, step.kv_indices, self.max_len,
                                   out=self.step_out[s, :n])
        out.copy_(self.step_out[:, :n].sum(0))
        return self.out[:bs]


class DSV4Model(DecodeModel):
    """DeepSeek-V4-style sparse decode attention reading exactly the upgraded metadata: the SWA window
    (``swa_page_indices``, ``swa_topk_lengths``) in the SWA pool, and the c128 compressed entries
    (``c128_page_indices``, -1 past the completed 128-token blocks) in the compressed pool, under one softmax. Static
    shapes: captured with the metadata."""

    def __init__(self, swa_k, swa_v, c128_k, c128_v, max_bs: int, max_len: int):
        super().__init__(swa_k, swa_v, max_bs, max_len)
        self.c128_k, self.c128_v = c128_k, c128_v

    def forward(self, meta, bs: int) -> torch.Tensor:
        q, out = self.q[:bs], self.out[:bs]
        swa = meta.swa_page_indices[:bs].long()
        win = torch.arange(swa.shape[1], device=q.device)
        ok_swa = (win[None, :] < meta.swa_topk_lengths[:bs, None]) & (swa >= 0)
        comp = meta.c128_page_indices[:bs].long()
        ok_c = comp >= 0
        k = torch.cat([self.k_cache[swa.clamp(min=0)], self.c128_k[comp.clamp(min=0)]], dim=1)
        v = torch.cat([self.v_cache[swa.clamp(min=0)], self.c128_v[comp.clamp(min=0)]], dim=1)
        return _attend(q, k, v, torch.cat([ok_swa, ok_c], dim=1), out)



class MLAModel(DecodeModel):
    """Multi-head latent attention (DeepSeek's decode, absorbed) reading an MLA backend's
    ``kv_indptr`` / ``kv_indices`` (token slots): queries ``[bs, heads, C + R]``, one latent KV head
    (``ckv [slots, C]``, ``kpe [slots, R]``), outputs ``[bs, heads, C]``. The torch reference
    (``mla_decode_attention``), static shapes: captured with the metadata."""

    def __init__(self, ckv, kpe, max_bs: int, max_len: int, heads: int):
        self.ckv, self.kpe, self.max_len = ckv, kpe, max_len
        self.q = torch.zeros(max_bs, heads, ckv.shape[1] + kpe.shape[1], dtype=ckv.dtype, device=ckv.device)
        self.out = torch.zeros(max_bs, heads, ckv.shape[1], dtype=ckv.dtype, device=ckv.device)

    def forward(self, meta, bs: int) -> torch.Tensor:
        return mla_decode_attention(self.q[:bs], self.ckv, self.kpe, meta.kv_indptr, meta.kv_indices, self.max_len,
                                    out=self.out[:bs])
