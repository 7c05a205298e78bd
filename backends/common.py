"""Inputs every decode spec reads, declared once with their fill values and host mirrors."""

from __future__ import annotations

from attnmeta.compiler.ir import DType, SpecBuilder, V


def decode_inputs(b: SpecBuilder) -> tuple[V, V, V]:
    """(seq_lens, req_pool_indices, req_to_token). Padded rows are sequences of length 1 that
    read pool row 0, which is reserved and all zero; both are staged from their host mirrors."""
    seq_lens = b.input("seq_lens", DType.int32, ["bs"], fill=1, mirror="seq_lens_cpu")
    rpi = b.input("req_pool_indices", DType.int64, ["bs"], fill=0, mirror="req_pool_indices_cpu")
    req_to_token = b.pool("req_to_token", DType.int32, ["R", "L"])
    return seq_lens, rpi, req_to_token


def extend_lens(b: SpecBuilder) -> V:
    """Draft extend: the accepted tokens per request (accept_length + 1). Padded rows extend by one."""
    return b.input("extend_seq_lens", DType.int32, ["bs"], fill=1, mirror="extend_seq_lens_cpu")


def prefix_lens(b: SpecBuilder) -> V:
    """Extend: tokens already in the cache before this chunk."""
    return b.input("extend_prefix_lens", DType.int32, ["bs"], fill=0, mirror="extend_prefix_lens_cpu")


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
