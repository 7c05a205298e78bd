"""Split-KV paged decode attention in Triton, reading the Triton backend's
metadata: ``kv_indptr``, ``kv_indices`` and ``num_kv_splits``.

Stage 1 runs one program per (request, head, split): split ``s`` of request
``b`` covers keys ``[s*chunk, (s+1)*chunk)`` of its range, with
``chunk = ceil(len / num_kv_splits[b])``; splits past ``num_kv_splits[b]``
are empty and write ``lse = -inf``. Stage 2 merges the partial outputs by
their log-sum-exp. Grids and buffers are sized by ``max_kv_splits``, so the
launch is static and capturable while the partition follows the replayed
batch. Query heads may share KV heads (GQA).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from attnmeta.compiler.lowering.launch import launch
from attnmeta.compiler.lowering.triton_kernels import jit


@jit
def _stage1(q, k, v, indptr, indices, splits, part_o, part_lse, s_qb, s_qh, s_kt, s_kh, s_vt, s_vh,
            scale, group, head_dim, max_splits, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h, sp = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    kvh = h // group
    start = tl.load(indptr + b)
    n = tl.load(indptr + b + 1) - start
    ns = tl.maximum(tl.load(splits + b), 1)
    chunk = (n + ns - 1) // ns
    lo = tl.minimum(sp * chunk, n)  # a split past num_kv_splits starts at n: empty
    hi = tl.minimum(lo + chunk, n)
    d = tl.arange(0, BLOCK_D)
    dm = d < head_dim
    qv = tl.load(q + b * s_qb + h * s_qh + d, mask=dm, other=0.0).to(tl.float32)
    m_i = tl.full([], float("-inf"), tl.float32)
    l_i = tl.full([], 0.0, tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for st in range(lo, hi, BLOCK_N):
        o = st + tl.arange(0, BLOCK_N)
        om = o < hi
        idx = tl.load(indices + start + o, mask=om, other=0).to(tl.int64)
        km = om[:, None] & dm[None, :]
        kk = tl.load(k + idx[:, None] * s_kt + kvh * s_kh + d[None, :], mask=km, other=0.0).to(tl.float32)
        sc = tl.where(om, tl.sum(kk * qv[None, :], axis=1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=0))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new)
        vv = tl.load(v + idx[:, None] * s_vt + kvh * s_vh + d[None, :], mask=km, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * vv, axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    base = (b * tl.num_programs(1) + h) * max_splits + sp
    tl.store(part_o + base * head_dim + d, acc / tl.maximum(l_i, 1e-30), mask=dm)
    tl.store(part_lse + base, tl.where(l_i > 0, m_i + tl.log(tl.maximum(l_i, 1e-30)), float("-inf")))


@jit
def _stage2(part_o, part_lse, splits, out, s_ob, s_oh, head_dim, max_splits,
            BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    b, h = tl.program_id(0), tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    sm = (s < tl.load(splits + b)) & (s < max_splits)
    d = tl.arange(0, BLOCK_D)
    dm = d < head_dim
    base = (b * tl.num_programs(1) + h) * max_splits
    lse = tl.load(part_lse + base + s, mask=sm, other=float("-inf"))
    live = sm & (lse > float("-inf"))
    top = tl.max(tl.where(live, lse, -1e30), axis=0)
    w = tl.where(live, tl.exp(lse - top), 0.0)
    po = tl.load(part_o + (base + s[:, None]) * head_dim + d[None, :], mask=sm[:, None] & dm[None, :], other=0.0)
    res = tl.sum(w[:, None] * po, axis=0) / tl.maximum(tl.sum(w, axis=0), 1e-30)  # no keys: zeros
    tl.store(out + b * s_ob + h * s_oh + d, res.to(out.dtype.element_ty), mask=dm)


class TritonDecodeAttention:
    """Static partial buffers sized once for (max_bs, heads, max_kv_splits); capturable."""

    def __init__(self, max_bs: int, heads: int, head_dim: int, max_kv_splits: int, device, block_n: int = 32):
        self.max_kv_splits, self.block_n = max_kv_splits, block_n
        self.part_o = torch.zeros(max_bs, heads, max_kv_splits, head_dim, dtype=torch.float32, device=device)
        self.part_lse = torch.zeros(max_bs, heads, max_kv_splits, dtype=torch.float32, device=device)

    def __call__(self, q, k_cache, v_cache, kv_indptr, kv_indices, num_kv_splits, out):
        bs, H, Dh = q.shape
        if bs == 0:
            return out
        group = H // k_cache.shape[1]
        S, bd = self.max_kv_splits, triton.next_power_of_2(Dh)
        a1 = (q, k_cache, v_cache, kv_indptr, kv_indices, num_kv_splits, self.part_o, self.part_lse,
              q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
              Dh**-0.5, group, Dh, S)
        launch(lambda: _stage1[(bs, H, S)](*a1, BLOCK_N=self.block_n, BLOCK_D=bd))
        a2 = (self.part_o, self.part_lse, num_kv_splits, out, out.stride(0), out.stride(1), Dh, S)
        launch(lambda: _stage2[(bs, H)](*a2, BLOCK_S=triton.next_power_of_2(S), BLOCK_D=bd))
        return out
