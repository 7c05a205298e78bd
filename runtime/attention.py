"""Torch reference paged decode attention that consumes the metadata.

``paged_decode_attention`` has static shapes only (it reads at most ``L``
keys per request, masked by the indptr), so it can be captured with the
metadata it reads. ``decode_attention_loop`` is the plain per-request loop
used as the oracle.
"""

from __future__ import annotations

import torch


def paged_decode_attention(q, k_cache, v_cache, kv_indptr, kv_indices, max_len: int, out=None):
    """q [bs, H, Dh]; caches [slots, H, Dh]; returns [bs, H, Dh]."""
    bs = q.shape[0]
    j = torch.arange(max_len, device=q.device)
    lens = (kv_indptr[1 : bs + 1] - kv_indptr[:bs]).long()
    pos = (kv_indptr[:bs, None].long() + j).clamp_(max=kv_indices.shape[0] - 1)
    valid = j[None, :] < lens[:, None]
    slots = torch.where(valid, kv_indices[pos].long(), 0)
    k, v = k_cache[slots], v_cache[slots]  # [bs, max_len, H, Dh]
    scores = torch.einsum("bhd,blhd->bhl", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # rows with no keys give zeros, not NaN
    r = torch.einsum("bhl,blhd->bhd", p, v)
    return r if out is None else out.copy_(r)


def decode_attention_loop(q, k_cache, v_cache, kv_indptr, kv_indices):
    """Oracle: one request at a time, keys taken straight from its index range."""
    outs = []
    for i in range(q.shape[0]):
        idx = kv_indices[int(kv_indptr[i]) : int(kv_indptr[i + 1])].long()
        k, v = k_cache[idx], v_cache[idx]  # [n, H, Dh]
        s = torch.einsum("hd,nhd->hn", q[i], k) * q.shape[-1] ** -0.5
        outs.append(torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v))
    return torch.stack(outs) if outs else q.new_zeros((0, *q.shape[1:]))


class DecodeModel:
    """The captured 'model': attention over static q/out buffers using the backend's metadata."""

    def __init__(self, k_cache, v_cache, max_bs: int, max_len: int):
        self.k_cache, self.v_cache, self.max_len = k_cache, v_cache, max_len
        H, Dh = k_cache.shape[1:]
        self.q = torch.zeros(max_bs, H, Dh, dtype=k_cache.dtype, device=k_cache.device)
        self.out = torch.zeros_like(self.q)

    def prepare(self, q: torch.Tensor, bs: int) -> None:
        n = q.shape[0]
        self.q[:n].copy_(q, non_blocking=True)
        self.q[n:bs].zero_()

    def forward(self, meta, bs: int) -> torch.Tensor:
        return paged_decode_attention(self.q[:bs], self.k_cache, self.v_cache, meta.kv_indptr, meta.kv_indices,
                                      self.max_len, out=self.out[:bs])
