"""SGLang's side of the integration tests: real ``ForwardBatch`` objects, the graph runner's replay
view (SGLang's own ``build_replay_fb_view``), a KV pool, and the oracles, all from SGLang's code or
computed from the pool by hand, never from attnmeta."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import torch
from sglang.kernels.ops.attention.kv_indices import create_flashinfer_kv_indices_triton
from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

L, ROWS, MAX_BS, D, SIZES = 512, 24, 8, 4, (1, 4, 8)
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
SGL_MODES = {"decode": ForwardMode.DECODE, "idle": ForwardMode.IDLE, "target_verify": ForwardMode.TARGET_VERIFY,
             "draft_extend": ForwardMode.DRAFT_EXTEND_V2}
# lengths that matter: 1, around multiples of 16/64/128/256, and the longest (verify reads D past the prefix)
EDGES = sorted({1, 2, L - D} | {m * k + d for m in (16, 64, 128, 256) for k in (1, 2) for d in (-1, 0, 1)
                               if 1 <= m * k + d <= L - D})


class Pool:
    """SGLang's MHA token-to-KV pool interface: per layer ``[slots, kv_heads, head_dim]`` K and V."""

    def __init__(self, slots: int, layers: int = 1, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.k = [torch.randn(slots, KV_HEADS, HEAD_DIM, generator=g) for _ in range(layers)]
        self.v = [torch.randn(slots, KV_HEADS, HEAD_DIM, generator=g) for _ in range(layers)]

    def get_key_buffer(self, layer_id):
        return self.k[layer_id]

    def get_value_buffer(self, layer_id):
        return self.v[layer_id]

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale=None, v_scale=None):
        self.k[layer.layer_id][loc] = cache_k.view(-1, KV_HEADS, HEAD_DIM)
        self.v[layer.layer_id][loc] = cache_v.view(-1, KV_HEADS, HEAD_DIM)


def make_pool(seed: int = 0, P: int = 1) -> torch.Tensor:
    """req_to_token as SGLang's paged allocator fills it: each row a random list of whole pages
    (page 0 unused), so token j of a row sits at slot page * P + j % P."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.randperm(ROWS * L // P, generator=g).view(ROWS, L // P) + 1
    t = (pages.repeat_interleave(P, dim=1) * P + torch.arange(L) % P).to(torch.int32)
    t[0] = 0  # SGLang's req_to_token row 0 is reserved too
    return t


def sglang_batch(mode: str, lens: list[int], rng: random.Random, ext: list[int] | None = None,
                 mask: bool = False, pool: Pool | None = None) -> ForwardBatch:
    """A real SGLang ForwardBatch; ``pool`` attaches a KV pool (attention tests)."""
    n = len(lens)
    seq = torch.tensor(lens, dtype=torch.int64)
    rows = torch.tensor(rng.sample(range(1, ROWS), n), dtype=torch.int64)
    tokens = n * (D if mode in ("target_verify", "draft_extend") else 1)
    spec = None
    if mode == "target_verify":
        spec = SimpleNamespace(custom_mask=torch.rand(sum(D * (s + D) for s in lens)) > 0.3 if mask else None,
                               num_tokens_per_req=D)
    if mode == "draft_extend":  # SGLang's draft-extend runner keeps the accepted counts on spec_info too
        spec = SimpleNamespace(extend_seq_lens_tensor=torch.tensor(ext, dtype=torch.int32),
                               extend_seq_lens_cpu=list(ext), num_tokens_per_req=D)
    fb = ForwardBatch(forward_mode=SGL_MODES[mode], batch_size=n, input_ids=torch.zeros(tokens, dtype=torch.int64),
                      req_pool_indices=rows, seq_lens=seq, out_cache_loc=torch.arange(1, tokens + 1),
                      seq_lens_sum=int(seq.sum()), seq_lens_cpu=seq.clone(), spec_info=spec,
                      positions=torch.zeros(tokens, dtype=torch.int64))
    if rng.random() < 0.5:  # the scheduler keeps a host mirror of the rows, or not
        fb.req_pool_indices_cpu = rows.clone()
    if ext is not None:
        fb.extend_seq_lens = torch.tensor(ext, dtype=torch.int32)
        fb.extend_seq_lens_cpu = list(ext)
    if pool is not None:
        fb.token_to_kv_pool = pool
    return fb


def replay_view(fb: ForwardBatch, bs: int, fill: int):
    """What SGLang's decode graph runner hands out_graph at replay: its capture buffers, padded to
    ``bs`` with the fill value and pool row 0, through SGLang's own ``build_replay_fb_view``."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    tokens = bs * (D if fb.forward_mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2) else 1)
    seq = torch.full((bs,), fill, dtype=torch.int64)
    rows = torch.zeros(bs, dtype=torch.int64)
    seq[:raw], rows[:raw] = fb.seq_lens[:raw], fb.req_pool_indices[:raw]
    bufs = SimpleNamespace(input_ids=torch.zeros(tokens, dtype=torch.int64), positions=torch.zeros(tokens),
                           req_pool_indices=rows, seq_lens=seq, seq_lens_cpu=seq.clone(), encoder_lens=None,
                           mamba_track_indices=None)
    mode = ForwardMode.DECODE if fb.forward_mode.is_idle() else fb.forward_mode
    return build_replay_fb_view(fb, bufs, bs, raw, tokens, None, fill, mode, False)


def sglang_kv_indices(req_to_token, rows, lens) -> torch.Tensor:
    """SGLang's own gather kernel."""
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    out = torch.zeros(int(indptr[-1]) or 1, dtype=torch.int32)
    if len(lens):
        create_flashinfer_kv_indices_triton[(len(lens),)](req_to_token, rows, lens.to(torch.int32), indptr, None, out,
                                                          req_to_token.stride(0))
    return out[: int(indptr[-1])]


def sglang_num_kv_splits(seq: torch.Tensor, sm_count: int) -> list[int]:
    """SGLang's Triton backend's split heuristic kernel (8 splits at most, its default)."""
    out = torch.empty(seq.shape[0], dtype=torch.int32)
    n = seq.shape[0]
    get_num_kv_splits_triton[(1,)](out, seq.to(torch.int32), n, 1, HEADS, KV_HEADS, 8, sm_count,
                                   MAX_NUM_SEQ=max(256, 1 << max(n - 1, 0).bit_length()))
    return out.tolist()


def attention_oracle(q, pool: Pool, req_to_token, rows, lens, scale: float) -> torch.Tensor:
    """Decode attention read from the pool by hand: request i over slots req_to_token[row_i, :len_i]."""
    outs = []
    for i, (r, n) in enumerate(zip(rows.tolist(), lens.tolist(), strict=True)):
        idx = req_to_token[r, :n].long()
        k = pool.k[0][idx].repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = pool.v[0][idx].repeat_interleave(HEADS // KV_HEADS, dim=1)
        p = torch.softmax(torch.einsum("hd,nhd->hn", q[i], k) * scale, -1)
        outs.append(torch.einsum("hn,nhd->hd", p, v))
    return torch.stack(outs)


def page_rows(req_to_token, rows, lens, P: int) -> list[list[int]]:
    """FlashAttention's page table rows as SGLang builds them: every P-th slot of the row, divided by P."""
    return [(req_to_token[r, ::P][: math.ceil(n / P)] // P).tolist() for r, n in zip(rows.tolist(), lens.tolist(),
                                                                                    strict=True)]


def extend_oracle(q, pool: Pool, req_to_token, rows, lens, verify: bool, masks, scale: float) -> torch.Tensor:
    """FlashInfer's verify and draft-extend attention read from the pool by hand: request i's D queries
    over req_to_token[row_i, :kv_len] (kv_len = seq + D in verify, seq in draft extend), under its tree
    mask rows (verify) or causally, query t seeing keys up to kv_len - D + t."""
    outs = []
    for i, (r, n) in enumerate(zip(rows.tolist(), lens.tolist(), strict=True)):
        kv_len = n + D if verify else n
        idx = req_to_token[r, :kv_len].long()
        k = pool.k[0][idx].repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = pool.v[0][idx].repeat_interleave(HEADS // KV_HEADS, dim=1)
        s = torch.einsum("thd,nhd->thn", q[i * D : (i + 1) * D], k) * scale
        t = torch.arange(D)
        allowed = masks[i].view(D, kv_len) if verify else torch.arange(kv_len)[None, :] <= (kv_len - D + t)[:, None]
        p = torch.softmax(s.masked_fill(~allowed[:, None, :], float("-inf")), -1)
        outs.append(torch.einsum("thn,nhd->thd", p, v))
    return torch.cat(outs)


def triton_extend_oracle(q, k_ext, v_ext, pool: Pool, req_to_token, rows, lens, ext, verify: bool, masks, scale):
    """SGLang's Triton extend semantics read by hand: request i's D queries over its prefix in the pool
    (seq tokens in verify, seq - accepted in draft extend) and its D new tokens' K/V as given; the
    prefix always visible, the new tokens under the tree mask (verify) or causally (draft extend)."""
    outs, group = [], HEADS // KV_HEADS
    for i, (r, n) in enumerate(zip(rows.tolist(), lens.tolist(), strict=True)):
        prefix = n if verify else max(n - ext[i], 0)
        idx = req_to_token[r, :prefix].long()
        k = torch.cat([pool.k[0][idx], k_ext[i * D : (i + 1) * D]]).repeat_interleave(group, dim=1)
        v = torch.cat([pool.v[0][idx], v_ext[i * D : (i + 1) * D]]).repeat_interleave(group, dim=1)
        t = torch.arange(D)
        new = masks[i].view(D, n + D)[:, n:] if verify else t[None, :] <= t[:, None]
        allowed = torch.cat([torch.ones(D, prefix, dtype=torch.bool), new], 1)
        s = torch.einsum("thd,nhd->thn", q[i * D : (i + 1) * D], k) * scale
        p = torch.softmax(s.masked_fill(~allowed[:, None, :], float("-inf")), -1)
        outs.append(torch.einsum("thn,nhd->thd", p, v))
    return torch.cat(outs)


def fa_extend_oracle(q, pool: Pool, req_to_token, rows, lens, ext, verify: bool, scale: float) -> torch.Tensor:
    """FlashAttention's verify and draft extend read by hand: request i's queries (D drafts in verify,
    its ext[i] accepted tokens in draft extend, packed) over req_to_token[row, :kv_len] (kv_len =
    seq + D in verify, seq in draft extend), causal aligned at the end."""
    outs, at, group = [], 0, HEADS // KV_HEADS
    for i, (r, n) in enumerate(zip(rows.tolist(), lens.tolist(), strict=True)):
        q_len, kv_len = (D, n + D) if verify else (ext[i], n)
        idx = req_to_token[r, :kv_len].long()
        k = pool.k[0][idx].repeat_interleave(group, dim=1)
        v = pool.v[0][idx].repeat_interleave(group, dim=1)
        t = torch.arange(q_len)
        allowed = torch.arange(kv_len)[None, :] <= (kv_len - q_len + t)[:, None]
        s = torch.einsum("thd,nhd->thn", q[at : at + q_len], k) * scale
        p = torch.softmax(s.masked_fill(~allowed[:, None, :], float("-inf")), -1)
        outs.append(torch.einsum("thn,nhd->thd", p, v))
        at += q_len
    return torch.cat(outs)
