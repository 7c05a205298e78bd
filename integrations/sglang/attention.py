"""Torch attention over the metadata, for kernels a machine lacks (no FlashInfer, no FlashAttention-3).

Static shapes only (every request reads ``max_len`` key positions, masked by its length), so it can
be captured in a CUDA graph with the metadata it reads; grouped-query heads share their KV head.
SGLang's KV pool layout: ``k_buf``/``v_buf`` are ``[slots, kv_heads, head_dim]``.
"""

from __future__ import annotations

import torch


def _attend(q, k_buf, v_buf, slots, valid, scale: float, out):
    """q [n, H, D]; slots/valid [n, max_len] -> out [n, H, Dv]."""
    group = q.shape[1] // k_buf.shape[1]
    k = k_buf[slots].float().repeat_interleave(group, dim=2)  # [n, max_len, H, D]
    v = v_buf[slots].float().repeat_interleave(group, dim=2)
    s = torch.einsum("nhd,nlhd->nhl", q.float(), k) * scale
    p = torch.softmax(s.masked_fill(~valid[:, None, :], float("-inf")), dim=-1).nan_to_num_(0.0)
    return out.copy_(torch.einsum("nhl,nlhd->nhd", p, v))


def decode_by_indices(q, k_buf, v_buf, kv_indptr, kv_indices, max_len: int, scale: float, out):
    """One query per request over ``kv_indices[kv_indptr[i]:kv_indptr[i+1]]``."""
    n = q.shape[0]
    j = torch.arange(max_len, device=q.device)
    lens = (kv_indptr[1 : n + 1] - kv_indptr[:n]).long()
    pos = (kv_indptr[:n, None].long() + j).clamp_(max=kv_indices.shape[0] - 1)
    valid = j[None, :] < lens[:, None]
    return _attend(q, k_buf, v_buf, torch.where(valid, kv_indices[pos].long(), 0), valid, scale, out)


def decode_by_page_table(q, k_buf, v_buf, page_table, cache_seqlens, page_size: int, max_len: int, scale: float,
                         out):
    """One query per request; key j of request i in slot ``page_table[i, j // P] * P + j % P``."""
    n = q.shape[0]
    j = torch.arange(max_len, device=q.device)
    valid = j[None, :] < cache_seqlens[:n, None]
    pages = page_table[:n, (j // page_size).clamp(max=page_table.shape[1] - 1)].long()
    return _attend(q, k_buf, v_buf, torch.where(valid, pages * page_size + j % page_size, 0), valid, scale, out)


def extend_by_indices(q, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices, max_len: int, scale: float, out,
                      mask=None, mask_indptr=None):
    """Several queries per request (rows ``qo_indptr[r]:qo_indptr[r+1]``) over its keys
    ``kv_indices[kv_indptr[r]:kv_indptr[r+1]]``, all in the pool. With ``mask`` (target verify):
    query t of request r sees key j where ``mask[mask_indptr[r] + t * kv_len + j]``; without,
    causal aligned at the end: query t of q_len sees keys ``j <= kv_len - q_len + t``."""
    n, bs = q.shape[0], kv_indptr.shape[0] - 1
    z = torch.arange(n, device=q.device)
    r = (torch.searchsorted(qo_indptr[1 : bs + 1].contiguous(), z, right=True)).clamp_(max=bs - 1)
    t = z - qo_indptr[r]
    q_len, kv_len = (qo_indptr[r + 1] - qo_indptr[r]).long(), (kv_indptr[r + 1] - kv_indptr[r]).long()
    j = torch.arange(max_len, device=q.device)
    valid = j[None, :] < kv_len[:, None]
    if mask is None:
        valid &= j[None, :] <= (kv_len - q_len + t)[:, None]
    else:
        at = (mask_indptr[r].long() + t * kv_len)[:, None] + j
        valid &= mask[at.clamp_(max=mask.numel() - 1)].bool()
    pos = (kv_indptr[r, None].long() + j).clamp_(max=kv_indices.shape[0] - 1)
    return _attend(q, k_buf, v_buf, torch.where(valid, kv_indices[pos].long(), 0), valid, scale, out)


def extend_by_page_table(q, k_buf, v_buf, cu_seqlens_q, page_table, cache_seqlens, page_size: int, max_len: int,
                         scale: float, out):
    """FlashAttention's varlen layout: request r's queries are rows ``cu_seqlens_q[r]:cu_seqlens_q[r+1]``,
    its keys the first ``cache_seqlens[r]`` tokens through its page table, causal aligned at the end.
    Rows past the last request's queries (padding) see no key and come out zero."""
    n, bs = q.shape[0], cache_seqlens.shape[0]
    z = torch.arange(n, device=q.device)
    r = torch.searchsorted(cu_seqlens_q[1 : bs + 1].contiguous(), z, right=True).clamp_(max=bs - 1)
    t = z - cu_seqlens_q[r]
    q_len, kv_len = (cu_seqlens_q[r + 1] - cu_seqlens_q[r]).long(), cache_seqlens[r].long()
    j = torch.arange(max_len, device=q.device)
    valid = (j[None, :] < kv_len[:, None]) & (j[None, :] <= (kv_len - q_len + t)[:, None]) & (t < q_len)[:, None]
    pages = page_table[r[:, None], (j // page_size).clamp(max=page_table.shape[1] - 1)[None, :]].long()
    return _attend(q, k_buf, v_buf, torch.where(valid, pages * page_size + j % page_size, 0), valid, scale, out)
