"""Test helpers: the padded batch a graph sees, and field comparison against a twin."""

from __future__ import annotations

import torch

from attnmeta.sim.compare import compare_metadata, padded

__all__ = ["assert_metadata_equal", "padded"]


def assert_metadata_equal(meta, ref, seq_lens_cpu: torch.Tensor, page_size: int = 1) -> None:
    bad = compare_metadata(meta, ref, seq_lens_cpu, page_size)
    assert bad == [], f"fields differing from the eager twin: {bad}"


def masked_attention_from_pool(q, k, v, pool, rows, lens, per_request: int, extra_keys: int, masks=None,
                               window: int = -1):
    """fp32 attention of ``per_request`` queries per request (``q`` [requests * per_request, H, d])
    over the keys ``pool[row, :len + extra_keys]`` (K/V heads repeated for grouped queries): under
    ``masks[i]`` (``per_request x keys``, the verify tree mask) when given, else causal aligned at
    the end, the last query seeing every key. ``window`` >= 0: a query at position p (the queries are
    the last keys) also sees no key before p - window."""
    outs, T = [], per_request
    group = q.shape[1] // k.shape[1]
    for i, (r, n) in enumerate(zip(rows, lens, strict=True)):
        kv_len = int(n) + extra_keys
        idx = pool[r, :kv_len].long()
        kk = k[idx].float().repeat_interleave(group, 1)
        vv = v[idx].float().repeat_interleave(group, 1)
        s = torch.einsum("thd,nhd->thn", q[i * T : (i + 1) * T].float(), kk) * q.shape[-1] ** -0.5
        if masks is not None:
            allowed = masks[i].view(T, kv_len)
        else:
            t = torch.arange(T, device=q.device)
            allowed = torch.arange(kv_len, device=q.device)[None, :] <= (kv_len - T + t)[:, None]
            if window >= 0:
                allowed &= torch.arange(kv_len, device=q.device)[None, :] >= (kv_len - T + t - window)[:, None]
        p = torch.softmax(s.masked_fill(~allowed[:, None, :], float("-inf")), -1)
        outs.append(torch.einsum("thn,nhd->thd", p, vv))
    return torch.cat(outs)


def token_kv_cache(slots: int, kv_heads: int, head_dim: int, seed: int, device) -> tuple:
    """(k, v, cache): random bf16 keys and values of ``slots`` token slots, and the paged cache FlashInfer reads
    (``(k, v)`` viewed as pages of one token, as SGLang hands its wrappers token slots)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, kv_heads, head_dim, generator=g).to(device).bfloat16()
    v = torch.randn(slots, kv_heads, head_dim, generator=g).to(device).bfloat16()
    return k, v, (k.view(-1, 1, kv_heads, head_dim), v.view(-1, 1, kv_heads, head_dim))
