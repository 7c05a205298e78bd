"""SGLang's batches for the DSV4 backend's tests: real ``ForwardBatch`` objects and the graph runner's
replay view (SGLang's own ``build_replay_fb_view``), over a request table filled as SGLang's allocator
fills it. (The other kinds' tests build their whole server: ``sglang_server.py``.)"""

from __future__ import annotations

import random
from types import SimpleNamespace

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import build_replay_fb_view

L, ROWS, MAX_BS, D, SIZES = 512, 24, 8, 4, (1, 4, 8)
SGL_MODES = {"decode": ForwardMode.DECODE, "idle": ForwardMode.IDLE, "target_verify": ForwardMode.TARGET_VERIFY,
             "draft_extend": ForwardMode.DRAFT_EXTEND_V2}


def make_pool(seed: int = 0, P: int = 1) -> torch.Tensor:
    """req_to_token as SGLang's paged allocator fills it: each row a random list of whole pages
    (page 0 unused), so token j of a row sits at slot page * P + j % P."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.randperm(ROWS * L // P, generator=g).view(ROWS, L // P) + 1
    t = (pages.repeat_interleave(P, dim=1) * P + torch.arange(L) % P).to(torch.int32)
    t[0] = 0  # SGLang's req_to_token row 0 is reserved too
    return t


def sglang_batch(mode: str, lens: list[int], rng: random.Random, ext: list[int] | None = None,
                 mask: bool = False, pool=None) -> ForwardBatch:
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
