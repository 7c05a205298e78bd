"""Triton attention backend metadata (decode), declared once. No host
planner: everything is device work recorded in the graph, including the
split-KV partition.

``num_kv_splits`` follows the engine's heuristic on device, both terms.
With ``max``/``min`` the longest/shortest sequence of the (padded) batch
(``min := max`` when they are within 25 %) and ``MAX_SPLITS`` the
``max_kv_splits`` option (SGLang's ``--triton-attention-num-kv-splits``):

- by length: ``s1 = min(ceil(max / min), MAX_SPLITS)``, ``chunk1 = ceil(max / s1)``;
- by SM count: ``cores = int(sm_count * max(log2(max / 64), 1))`` (float32, as
  the engine computes it), ``grid = bs * ceil(num_heads / min(16, group))``
  (``bs * num_heads`` without grouping), ``s2 = min(ceil(cores / grid),
  MAX_SPLITS)``, ``chunk2 = ceil(max / s2)``;

and ``splits_i = max(ceil(seq_i / chunk1), ceil(seq_i / chunk2))``. The
device and model are compile options (``sm_count``, ``num_heads``,
``num_kv_heads``); ``sm_count=0`` is the engine's static split (a device that
reports no SM count, or ``SGLANG_TRITON_DECODE_ATTN_STATIC_KV_SPLITS``): every
row gets ``MAX_SPLITS``. ``uneven_batch`` is the flag the same heuristic sets
for the decode kernel (``min < max`` after the 25 % rule; 0 when static).
Computed from the replayed batch, never frozen at capture.
"""

from __future__ import annotations

import attrs

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Placement, SpecBuilder
from attnmeta.compiler.ir.errors import OptionsError

from ..common import decode_inputs, extend_lens, verify_mask, window_stream

I32, I64 = DType.int32, DType.int64


@attrs.frozen
class TritonOptions:
    """Triton's own options (``CompileOptions(backend=TritonOptions(...))``; also its TBO and multi-step forms)."""

    max_kv_splits: int = 8  # the most splits a row may get (SGLang's --triton-attention-num-kv-splits)
    # EAGLE's drafter only (multistep_triton): each draft step attends to its prefix's first ``draft_sink`` tokens
    # and last ``draft_window`` (SGLang's --speculative-draft-window-size / --speculative-draft-sink-size), then its
    # drafts; 0: the whole prefix
    draft_window: int = 0
    draft_sink: int = 0

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.max_kv_splits, int) or isinstance(self.max_kv_splits, bool) or self.max_kv_splits < 1:
            raise OptionsError(f"max_kv_splits must be an int >= 1, got {self.max_kv_splits!r} (--max-kv-splits)")
        for name in ("draft_window", "draft_sink"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise OptionsError(f"{name} must be an int >= 0 (tokens; 0: none), got {v!r}")
        if self.draft_sink and not self.draft_window:
            raise OptionsError(f"draft_sink={self.draft_sink} needs a draft window (draft_window > 0): sink tokens "
                               "are kept beside a window of recent ones")


def num_kv_splits(b: SpecBuilder, seq_lens, options: CompileOptions, prefix: str = ""):
    """(num_kv_splits per row, the uneven_batch flag); ``prefix`` names them for another set of lengths (the
    window's)."""
    max_splits = options.of(TritonOptions).max_kv_splits
    if options.sm_count == 0:  # the engine's static split: no heuristic at all
        return (b.full(max_splits, ["bs"], I32, name=f"{prefix}num_kv_splits"),
                b.full(0, [], I32, name=f"{prefix}uneven_batch"))
    longest = b.reduce("max", seq_lens)
    shortest = b.reduce("min", seq_lens)
    close = b.compare("lt", b.ewise("mul", longest, 8), b.ewise("mul", shortest, 10))
    shortest = b.where(close, longest, shortest)
    uneven = b.cast(b.compare("lt", shortest, longest), I32, name=f"{prefix}uneven_batch")
    shortest = b.ewise("max", shortest, 1)  # a zero-size TBO child has no rows
    splits = b.clamp(b.ewise("ceildiv", longest, shortest), 1, max_splits)
    chunk = b.ewise("max", b.ewise("ceildiv", longest, splits), 1)
    # the SM-count term: enough splits to fill the device when the batch alone would not
    group = options.num_heads // options.num_kv_heads
    per_row = options.num_heads if group == 1 else -(-options.num_heads // min(16, group))
    grid = b.ewise("max", b.reduce("sum", b.full(per_row, ["bs"], I32)), 1)  # bs * per_row, folded at bind
    cores = b.log2_scale(longest, scale=options.sm_count, divisor=64)
    splits2 = b.ewise("min", b.ewise("ceildiv", cores, grid), max_splits)
    chunk2 = b.ewise("max", b.ewise("ceildiv", longest, splits2), 1)
    return b.ewise("max", b.ewise("ceildiv", seq_lens, chunk), b.ewise("ceildiv", seq_lens, chunk2),
                   name=f"{prefix}num_kv_splits"), uneven


def window(b: SpecBuilder, keys, rpi, req_to_token, options: CompileOptions, tokens: str = "bs") -> dict:
    """The window layers' metadata (``options.sliding_window`` = SW > 0), as the engine builds it beside the
    full layers': of each request's ``keys`` cached tokens the last ``min(keys, SW)`` (``window_kv_indptr``,
    ``window_kv_indices``; the window pool's slots when ``window_pool``, translated from the full pool's through
    its ``full_to_swa`` table, with the step's ``tokens`` write slots ``swa_out_cache_loc``). Decode adds their
    split counts (the same heuristic over the window lengths); verify and draft extend, whose queries extend past
    the keys, the window's first column per request (``window_kv_offsets``: where the tree mask's window
    columns start). Nothing without a window."""
    if not options.sliding_window:
        return {}
    stream = window_stream(b, keys, rpi, req_to_token, options, tokens=tokens)
    lens, start = stream.pop("window_kv_lens"), stream.pop("window_kv_start")
    if tokens == "bs":  # decode
        with b.in_graph():
            stream["window_num_kv_splits"] = num_kv_splits(b, lens, options, prefix="window_")[0]
    else:
        stream["window_kv_offsets"] = start
    return stream


def windowed(ragged: dict, win: dict) -> dict:
    """The outputs' ragged map with the window's indices (when there is a window)."""
    return ragged | ({"window_kv_indices": "window_kv_indptr"} if win else {})


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"triton.{mode.name.lower()}")
    seq_lens, rpi, req_to_token = decode_inputs(b)
    if mode.is_target_verify():
        return verify(b, options.num_draft_tokens, seq_lens, rpi, req_to_token, options)
    if mode.is_draft_extend():
        return draft_extend(b, options.num_draft_tokens, seq_lens, rpi, req_to_token, options)
    with b.in_graph():
        kv_indptr = b.cumsum(seq_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, seq_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
        splits, uneven = num_kv_splits(b, seq_lens, options)
    win = window(b, seq_lens, rpi, req_to_token, options)
    with b.out_graph():
        max_splits = b.full(options.of(TritonOptions).max_kv_splits, [], I32, Placement.host, name="max_kv_splits")
    b.outputs(kv_indptr=kv_indptr, kv_indices=kv_indices, num_kv_splits=splits, uneven_batch=uneven,
              max_kv_splits=max_splits, ragged=windowed({"kv_indices": "kv_indptr"}, win), **win)
    return b.build()


def verify(b: SpecBuilder, D: int, seq_lens, rpi, req_to_token, options: CompileOptions) -> Graph:
    """Target verify: D draft tokens per request attend to the prefix (the draft K/V are passed
    separately); request i's tree-mask rows start at mask_indptr[i] = sum_j<i D*(seq_j + D). The
    mask itself is written by the drafter into the engine's buffer, as engines do."""
    with b.in_graph():
        qo_indptr = b.arange("bs + 1", step=D, name="qo_indptr")
        kv_indptr = b.cumsum(seq_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, seq_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
        mask_indptr = b.cumsum(b.ewise("mul", b.ewise("add", seq_lens, D), D), name="mask_indptr")
        custom_mask = verify_mask(b, D)
    win = window(b, seq_lens, rpi, req_to_token, options, f"{D}*bs")
    with b.out_graph():
        max_extend = b.full(D, [], I32, Placement.host, name="max_extend_len")
    b.outputs(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, mask_indptr=mask_indptr,
              custom_mask=custom_mask, max_extend_len=max_extend,
              ragged=windowed({"kv_indices": "kv_indptr"}, win), **win)
    return b.build()


def draft_extend(b: SpecBuilder, T: int, seq_lens, rpi, req_to_token, options: CompileOptions) -> Graph:
    """Draft extend: T query slots per request (a fixed stride, so the graph is static), keys over
    the tokens before the extension: kv_len = max(seq_lens - extend_seq_lens, 0)."""
    ext = extend_lens(b)
    with b.in_graph():
        kv_lens = b.ewise("max", b.ewise("sub", seq_lens, ext), 0)
        qo_indptr = b.arange("bs + 1", step=T, name="qo_indptr")
        kv_indptr = b.cumsum(kv_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, kv_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
    win = window(b, kv_lens, rpi, req_to_token, options, f"{T}*bs")
    with b.out_graph():
        max_extend = b.full(T, [], I32, Placement.host, name="max_extend_len")
    b.outputs(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, max_extend_len=max_extend,
              ragged=windowed({"kv_indices": "kv_indptr"}, win), **win)
    return b.build()


def not_a_drafter(options: CompileOptions, name: str = "triton") -> None:
    """A draft window is the multi-step drafter's (multistep_triton reads it); compiled into triton itself it would
    be silently unread."""
    w = options.of(TritonOptions).draft_window
    if w:
        raise OptionsError(f"draft_window={w}: only EAGLE's multi-step drafter attends through a draft window, and "
                           f"{name!r} is not one; compile multistep_{name} (--draft-window), or leave it 0")


SPEC = BackendSpec("triton", build, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                   doc="Triton split-KV decode: kv_indptr, kv_indices, num_kv_splits on device; no planner",
                   options_type=TritonOptions, windows=True, check=not_a_drafter)
