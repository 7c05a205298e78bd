"""Inputs every decode spec reads, declared once with their fill values and host mirrors; and the one
gather the eager twins share."""

from __future__ import annotations

import torch

from attnmeta.compiler.ir import DType, Kind, Placement, SpecBuilder, V


def seq_bound(headroom: int) -> str | None:
    """The longest sequence a mode serves: L, less the columns it reads past seq_lens."""
    return f"L - {headroom}" if headroom else None


def decode_inputs(b: SpecBuilder, headroom: int = 0, hi: str | None = None) -> tuple[V, V, V]:
    """(seq_lens, req_pool_indices, req_to_token). Padded rows are sequences of length 1 that
    read pool row 0, which is reserved and all zero; both are staged from their host mirrors.
    ``headroom``: columns a step reads past seq_lens (verify drafts): longer sequences are refused.
    ``hi``: the bound written out instead, when it depends on the row (``"L - D + extend_seq_lens"``)."""
    seq_lens = b.input("seq_lens", DType.int32, ["bs"], fill=1, mirror="seq_lens_cpu", kind=Kind.length,
                       hi=hi if hi is not None else seq_bound(headroom))
    rpi = b.input("req_pool_indices", DType.int64, ["bs"], fill=0, mirror="req_pool_indices_cpu", kind=Kind.row)
    req_to_token = b.pool("req_to_token", DType.int32, ["R", "L"])
    return seq_lens, rpi, req_to_token


def host_seq_lens(b: SpecBuilder, headroom: int = 0) -> V:
    """seq_lens_cpu read on the host (planners' indptrs), with seq_lens' bound."""
    return b.input("seq_lens_cpu", DType.int32, ["bs"], Placement.host, fill=1, kind=Kind.length,
                   hi=seq_bound(headroom))


def extend_lens(b: SpecBuilder, hi: str | None = "D") -> V:
    """Draft extend: the accepted tokens per request (accept_length + 1, at most D). Padded rows
    extend by one. ``hi=None`` for a prefill chunk (bounded by L)."""
    return b.input("extend_seq_lens", DType.int32, ["bs"], fill=1, mirror="extend_seq_lens_cpu", kind=Kind.length,
                   hi=hi)


def prefix_lens(b: SpecBuilder) -> V:
    """Extend: tokens already in the cache before this chunk."""
    return b.input("extend_prefix_lens", DType.int32, ["bs"], fill=0, mirror="extend_prefix_lens_cpu",
                   kind=Kind.length)


def verify_mask(b: SpecBuilder, D: int) -> V:
    """The tree-mask buffer the drafter writes before each verify replay: D rows of (prefix + D)
    per request, at most max_bs*D*(L + D) entries, all True until written (padded rows see True)."""
    return b.full(1, [f"max_bs*{D}*(L + {D})"], DType.bool, name="custom_mask")


def verify_headroom(mode, options) -> int:
    """TARGET_VERIFY reads the D drafted tokens' slots after each prefix: seq_lens + D <= L."""
    return options.num_draft_tokens if mode.is_target_verify() else 0


def sub_rows(b: SpecBuilder, n: int, count: str | None = None) -> tuple[V, V]:
    """For n rows per request (query tokens, draft branches), rows z = r*n + t in the order engines
    lay them out: each row's request r = z // n and index t = z % n. Both are constants, so a row
    reads its request's fields by a per-row lookup and everything stays in one kernel over the rows.
    ``count``: how the row count is written (``"K"`` where inlined shapes say ``K*bs``)."""
    z = b.arange(f"{count or n}*bs")
    return b.ewise("floordiv", z, n), b.ewise("mod", z, n)


# the eager twins' one gather (flashinfer's, triton's and flashinfer_mla's twins read a prefix's slots alike)
def gather_kv_indices(req_to_token, rpi, seq_lens, kv_indptr, total: int) -> torch.Tensor:
    """Flat token-slot indices of every request's prefix, vectorised torch."""
    bs = seq_lens.shape[0]
    row = torch.repeat_interleave(torch.arange(bs, device=seq_lens.device), seq_lens.long(), output_size=total)
    col = torch.arange(total, device=seq_lens.device) - kv_indptr[:-1].long()[row]
    return req_to_token[rpi.long()[row], col]


def window_stream(b: SpecBuilder, keys: V, rpi: V, req_to_token: V, options, past: int = 0,
                  tokens: str = "bs") -> dict:
    """A sliding-window layer's index stream, as the engine gathers it beside the full layers': of each request's
    ``keys`` cached tokens the last ``min(keys, SW + past)`` (``past`` 1 where the backend's window counts the
    current token besides its SW before it), ``window_kv_lens``, ``window_kv_indptr``, their first column
    ``window_kv_start`` and ``window_kv_indices``: the window pool's slots when ``window_pool``, translated from
    the full pool's through its ``full_to_swa`` table, with the step's ``tokens`` write slots
    ``swa_out_cache_loc``."""
    width = options.sliding_window + past
    out = {}
    with b.in_graph():
        out["window_kv_lens"] = lens = b.ewise("min", keys, width, name="window_kv_lens")
        out["window_kv_indptr"] = indptr = b.cumsum(lens, name="window_kv_indptr")
        # the window's first column (entries j read column start + j): named where the queries extend past the keys
        named = None if tokens == "bs" else "window_kv_offsets"
        out["window_kv_start"] = start = b.ewise("sub", keys, lens, name=named)
        idx = b.ragged_gather(req_to_token, rpi, lens, indptr, capacity=f"max_bs*(SW+{past})",
                              jump=(b.full(0, ["bs"], DType.int32), start),
                              name="window_kv_full" if options.window_pool else "window_kv_indices")
        out |= window_slots(b, idx, options, tokens)
    return out


def window_slots(b: SpecBuilder, idx: V, options, tokens: str) -> dict:
    """A window stream's ``window_kv_indices`` from its full-pool slots ``idx``: with ``window_pool``, the window
    pool's slots through the engine's ``full_to_swa`` table, and the step's ``tokens`` write slots translated
    (``swa_out_cache_loc``); else ``idx`` itself. Inside ``b.in_graph()``."""
    if not options.window_pool:
        return {"window_kv_indices": idx}
    full_to_swa = b.pool("full_to_swa", DType.int64, ["N"])
    out_loc = b.input("out_cache_loc", DType.int64, [tokens], fill=0, kind=Kind.slot)
    return {"window_kv_indices": b.lookup(full_to_swa, idx, name="window_kv_indices"),
            "swa_out_cache_loc": b.lookup(full_to_swa, out_loc, name="swa_out_cache_loc")}
