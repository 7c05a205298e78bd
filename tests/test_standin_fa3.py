"""The torch stand-in of FlashAttention-3's ``flash_attn_with_kvcache`` (``tests/gpu/standin/sgl_kernel``, what
SGLang's ``fa3`` and ``attnmeta_fa3`` attend with in SGLang's real engine on the lent H200) against attention
written out request by request and query by query from the page table, on small cases worked by the
same rules FA3 documents: a request's last query sits at its last key, causal queries see keys up to their
own position, a window ``(left, right)`` around it, a soft cap, grouped heads."""

import math

import pytest
import torch

from tests.fake_fa3 import _sgl_kernel

FA = _sgl_kernel()[0].flash_attn_with_kvcache


def by_hand(q, kc, vc, table, lens, cu, causal, window, softcap, scale):
    P, H, Hkv = kc.shape[1], q.shape[1], kc.shape[2]
    out = torch.zeros(q.shape[0], H, vc.shape[-1])
    for b in range(len(lens)):
        n = cu[b + 1] - cu[b]
        for r in range(n):
            pos = lens[b] - n + r
            for h in range(H):
                scores, values = [], []
                for j in range(lens[b]):
                    if causal and j > pos:
                        continue
                    if window[0] >= 0 and j < pos - window[0]:
                        continue
                    if not causal and window[1] >= 0 and j > pos + window[1]:
                        continue
                    page, slot = table[b][j // P], j % P
                    s = float(q[cu[b] + r, h] @ kc[page, slot, h // (H // Hkv)]) * scale
                    scores.append(softcap * math.tanh(s / softcap) if softcap else s)
                    values.append(vc[page, slot, h // (H // Hkv)])
                if scores:
                    w = torch.softmax(torch.tensor(scores), 0)
                    out[cu[b] + r, h] = sum(wi * vi for wi, vi in zip(w, values, strict=True))
    return out


@pytest.mark.parametrize("causal,window,softcap", [(True, (-1, -1), 0.0), (True, (3, 0), 0.0), (False, (-1, -1), 0.0),
                                                    (True, (-1, -1), 5.0), (False, (2, 1), 0.0)])
def test_the_stand_in_attends_as_fa3_reads(causal, window, softcap):
    g = torch.Generator().manual_seed(3)
    P, pages, H, Hkv, D = 4, 12, 4, 2, 8
    kc, vc = torch.randn(pages, P, Hkv, D, generator=g), torch.randn(pages, P, Hkv, D, generator=g)
    table = [[5, 2, 9], [7, 1, 0], [3, 11, 6]]  # request 1's unused pages hold 0; request 2 uses all three
    lens, nq = [9, 3, 12], [1, 3, 2]  # decode, a verify-like 3 queries, 2 queries
    cu = [0, 1, 4, 6]
    q = torch.randn(cu[-1], H, D, generator=g)
    scale = D ** -0.5
    got, lse = FA(q, kc, vc, page_table=torch.tensor(table, dtype=torch.int32),
                  cache_seqlens=torch.tensor(lens, dtype=torch.int32), cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
                  max_seqlen_q=max(nq), softmax_scale=scale, causal=causal, window_size=window, softcap=softcap,
                  return_softmax_lse=True)
    want = by_hand(q, kc, vc, table, lens, cu, causal, window, softcap, scale)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert lse.shape == (H, cu[-1]) and torch.isfinite(lse).all()


def test_into_out_and_the_batched_form():
    g = torch.Generator().manual_seed(4)
    kc, vc = torch.randn(6, 2, 1, 4, generator=g), torch.randn(6, 2, 1, 4, generator=g)
    q = torch.randn(2, 1, 2, 4, generator=g)  # [B, Sq, H, D]: no cu_seqlens_q
    table, lens = torch.tensor([[1, 4], [2, 0]], dtype=torch.int32), torch.tensor([3, 2], dtype=torch.int32)
    out = torch.empty(2, 2, 4)
    FA(q, kc, vc, page_table=table, cache_seqlens=lens, causal=True, out=out)
    want = by_hand(q.view(2, 2, 4), kc, vc, table.tolist(), lens.tolist(), [0, 1, 2], True, (-1, -1), 0.0, 0.5)
    assert torch.allclose(out, want, atol=1e-5)


def test_what_it_does_not_read_is_refused_by_name():
    kc = torch.zeros(2, 2, 1, 4)
    with pytest.raises(RuntimeError, match=r"\['k', 'v'\]"):
        FA(torch.zeros(1, 1, 4), kc, kc, k=kc, v=kc, cache_seqlens=torch.ones(1, dtype=torch.int32),
           cu_seqlens_q=torch.tensor([0, 1], dtype=torch.int32), max_seqlen_q=1)


def test_tokens_past_the_last_request_are_not_attended():
    """A captured draft extend runs its padded token count before the extend lengths are written: FA3 reads
    only ``q[:cu_seqlens_q[-1]]`` and leaves zeros after; the stand-in neither indexes past its tensors
    (a device-side assert under capture) nor lets the padding move a real row."""
    g = torch.Generator().manual_seed(5)
    kc, vc = torch.randn(6, 2, 1, 4, generator=g), torch.randn(6, 2, 1, 4, generator=g)
    table, lens = torch.tensor([[1, 4], [2, 0]], dtype=torch.int32), torch.tensor([3, 2], dtype=torch.int32)
    q = torch.randn(6, 1, 4, generator=g)  # 2 requests x 3 padded tokens; only 1 + 1 are real
    cu = [0, 1, 2]
    got = FA(q, kc, vc, page_table=table, cache_seqlens=lens, cu_seqlens_q=torch.tensor(cu, dtype=torch.int32),
             max_seqlen_q=3, causal=True)
    want = by_hand(q[:2], kc, vc, table.tolist(), lens.tolist(), cu, True, (-1, -1), 0.0, 0.5)
    assert torch.allclose(got[:2], want, atol=1e-5) and not got[2:].any()


def test_one_key_width_makes_tables_of_other_widths_compute_the_same(monkeypatch):
    """Two tables equal in every entry FA3 reads, one wider: with ``ATTNMETA_STANDIN_KEYS`` both are reduced at
    that width, so their outputs are bitwise equal, and equal to the hand-computed attention; a table wider than
    the width is refused by name (padding it down would drop keys)."""
    g = torch.Generator().manual_seed(6)
    P, H, D = 2, 2, 8
    kc, vc = torch.randn(16, P, 1, D, generator=g), torch.randn(16, P, 1, D, generator=g)
    narrow = torch.tensor([[3, 7, 1], [9, 2, 0]], dtype=torch.int32)
    wide = torch.cat([narrow, torch.tensor([[15, 4], [6, 8]], dtype=torch.int32)], 1)  # unread pages, not zero
    lens, cu = torch.tensor([5, 3], dtype=torch.int32), torch.tensor([0, 1, 2], dtype=torch.int32)
    q = torch.randn(2, H, D, generator=g)
    kw = dict(cache_seqlens=lens, cu_seqlens_q=cu, max_seqlen_q=1, causal=True, window_size=(2, 0))
    monkeypatch.setenv("ATTNMETA_STANDIN_KEYS", "12")
    a, b = FA(q, kc, vc, page_table=narrow, **kw), FA(q, kc, vc, page_table=wide, **kw)
    assert torch.equal(a, b)
    want = by_hand(q, kc, vc, narrow.tolist(), lens.tolist(), cu.tolist(), True, (2, 0), 0.0, D ** -0.5)
    assert torch.allclose(a, want, atol=1e-5)
    monkeypatch.setenv("ATTNMETA_STANDIN_KEYS", "8")
    with pytest.raises(RuntimeError, match="wider than ATTNMETA_STANDIN_KEYS=8"):
        FA(q, kc, vc, page_table=wide, **kw)
