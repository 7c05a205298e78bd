"""Torch reference attention that consumes the metadata, and oracles computed from the pool.

``paged_decode_attention`` has static shapes only (it reads at most ``L``
keys per request, masked by the indptr), so it can be captured with the
metadata it reads. ``decode_attention_loop`` and ``attention_from_pool`` are
the plain per-request oracles (the latter reads no metadata at all).
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
    return _attend(q, k_cache[slots], v_cache[slots], valid, out)  # [bs, max_len, H, Dh] keys


def paged_decode_attention_pt(q, k_cache, v_cache, page_table, cache_seqlens, page_size: int, max_len: int,
                              out=None):
    """FlashAttention-style metadata: key j of request i sits in slot page_table[i, j // P] * P + j % P."""
    j = torch.arange(max_len, device=q.device)
    valid = j[None, :] < cache_seqlens[:, None]
    pages = page_table[:, (j // page_size).clamp(max=page_table.shape[1] - 1)].long()
    slots = torch.where(valid, pages * page_size + j % page_size, 0)
    return _attend(q, k_cache[slots], v_cache[slots], valid, out)


def _attend(q, k, v, valid, out):
    scores = torch.einsum("bhd,blhd->bhl", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num_(0.0)  # rows with no keys give zeros, not NaN
    r = torch.einsum("bhl,blhd->bhd", p, v)
    return r if out is None else out.copy_(r)


def _one(q, k, v):
    """The oracles' attention of one request: q [H, Dh] over its n keys and values [n, H, Dh]."""
    s = torch.einsum("hd,nhd->hn", q, k) * q.shape[-1] ** -0.5
    return torch.einsum("hn,nhd->hd", torch.softmax(s, -1), v)


def mla_decode_attention(q, ckv, kpe, kv_indptr, kv_indices, max_len: int, out=None):
    """Multi-head latent attention (DeepSeek's, absorbed) over indptr/indices metadata, static shapes:
    q [bs, H, C + R] (the latent part, then the rope part); ckv [slots, C], kpe [slots, R] (one latent
    KV head); returns [bs, H, C], each head's softmax over its keys applied to their latents."""
    bs, C = q.shape[0], ckv.shape[1]
    j = torch.arange(max_len, device=q.device)
    lens = (kv_indptr[1 : bs + 1] - kv_indptr[:bs]).long()
    pos = (kv_indptr[:bs, None].long() + j).clamp_(max=kv_indices.shape[0] - 1)
    valid = j[None, :] < lens[:, None]
    slots = torch.where(valid, kv_indices[pos].long(), 0)
    c, p = ckv[slots], kpe[slots]  # [bs, max_len, C], [bs, max_len, R]
    scores = (torch.einsum("bhc,blc->bhl", q[..., :C], c) + torch.einsum("bhr,blr->bhl", q[..., C:], p)) \
        * q.shape[-1] ** -0.5
    w = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1).nan_to_num_(0.0)
    r = torch.einsum("bhl,blc->bhc", w, c)
    return r if out is None else out.copy_(r)


def mla_attention_from_pool(q, ckv, kpe, req_to_token, req_pool_indices, seq_lens_cpu):
    """Oracle for ``mla_decode_attention`` from the pool itself: request i attends to the latents of the
    slots req_to_token[rpi_i, :seq_i]."""
    outs, C = [], ckv.shape[1]
    for i, (r, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens_cpu.tolist(), strict=True)):
        idx = req_to_token[r, :n].long()
        c, p, qi = ckv[idx].cpu(), kpe[idx].cpu(), q[i].cpu()
        s = (qi[:, :C] @ c.T + qi[:, C:] @ p.T) * q.shape[-1] ** -0.5
        outs.append(torch.softmax(s, -1) @ c)
    return torch.stack(outs) if outs else q.new_zeros((0, q.shape[1], C)).cpu()


def attention_from_pool(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens_cpu):
    """Oracle from the pool itself, no metadata at all: request i attends to the slots
    req_to_token[rpi_i, :seq_i]. A pool of fewer KV heads than q's (grouped-query attention) is expanded
    per request, after the gather, in q's dtype: never the whole pool (a 4096-token x 300-row pool of 8
    heads is 19 GiB once widened to 32 heads in fp32)."""
    outs, groups = [], q.shape[1] // k_cache.shape[1]
    for i, (r, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens_cpu.tolist(), strict=True)):
        idx = req_to_token[r, :n].long()
        k, v = k_cache[idx].cpu().to(q.dtype), v_cache[idx].cpu().to(q.dtype)  # gather where the pool lives
        if groups > 1:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        outs.append(_one(q[i].cpu(), k, v))
    return torch.stack(outs) if outs else q.new_zeros((0, *q.shape[1:])).cpu()


def draft_attention_from_pool(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens_cpu, num_steps: int,
                              topk: int = 1):
    """Oracle for a drafter's S steps on a page-size-1 pool, summed over steps as DraftModel sums
    them: at step s, branch k of request b attends to its prefix, then to the s + 1 slots at
    columns seq_b + k*S onwards. q is [bs, H, Dh], or [bs, K, H, Dh] with topk K > 1."""
    if not req_pool_indices.numel():
        return q.new_zeros(q.shape).cpu()
    rows = [torch.cat([req_to_token[r, :n], req_to_token[r, n + k * num_steps : n + (k + 1) * num_steps]])
            for r, n in zip(req_pool_indices.tolist(), seq_lens_cpu.tolist(), strict=True) for k in range(topk)]
    table = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)  # row z = b*K + k, zero-padded
    flat, seq = q.reshape(-1, *q.shape[-2:]), seq_lens_cpu.repeat_interleave(topk)
    out = sum(attention_from_pool(flat, k_cache, v_cache, table, torch.arange(len(rows)), seq + s + 1)
              for s in range(num_steps))
    return out.view(q.shape)


def decode_attention_loop(q, k_cache, v_cache, kv_indptr, kv_indices):
    """Oracle: one request at a time, keys taken straight from its index range."""
    outs = []
    for i in range(q.shape[0]):
        idx = kv_indices[int(kv_indptr[i]) : int(kv_indptr[i + 1])].long()
        k, v = k_cache[idx], v_cache[idx]  # [n, H, Dh]
        outs.append(_one(q[i], k, v))
    return torch.stack(outs) if outs else q.new_zeros((0, *q.shape[1:]))


def dsv4_attention_from_pool(q, swa_k, swa_v, c128_k, c128_v, req_to_token, full_to_swa, req_pool_indices,
                             seq_lens_cpu, window: int = 128, page: int = 256):
    """Oracle for DSV4-style sparse decode attention, from the pools alone: a request attends to the
    SWA copies of its last ``window`` tokens and to one compressed entry per full 128-token block
    (block j: entry ``2 * page_of(token j // 2 * 256) + j % 2``), under one softmax."""
    outs, f2s = [], full_to_swa.cpu()
    for i, (r, n) in enumerate(zip(req_pool_indices.tolist(), seq_lens_cpu.tolist(), strict=True)):
        row = req_to_token[r].long().cpu()
        swa = f2s[row[max(0, n - window) : n]].long()
        comp = torch.tensor([int(row[j // 2 * page]) // page * 2 + j % 2 for j in range(n // 128)], dtype=torch.long)
        dev = swa_k.device  # gather where the pools live, move only the rows read
        k = torch.cat([swa_k[swa.to(dev)].cpu(), c128_k[comp.to(c128_k.device)].cpu()])
        v = torch.cat([swa_v[swa.to(dev)].cpu(), c128_v[comp.to(c128_v.device)].cpu()])
        outs.append(_one(q[i].cpu(), k, v))
    return torch.stack(outs) if outs else q.new_zeros((0, *q.shape[1:])).cpu()

