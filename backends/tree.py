"""What an EAGLE tree verify's mask shows each draft query, read in the graph: shared by the kinds that attend
a tree per draft query (FlashAttention's expansion and its window layers, FlashInfer's window layers)."""

from __future__ import annotations

import attrs

from attnmeta.compiler.ir import DType, SpecBuilder

from .common import sub_rows

I32, I64 = DType.int32, DType.int64


def spread(b: SpecBuilder, x, width: int):
    """``x`` (one value per row) in every column of a ``[rows, width]`` value."""
    return b.outer("add", x, b.full(0, [width], x.type.dtype))


@attrs.frozen
class Visible:
    """What a tree verify's mask shows, one row per draft query r = i * D + j (``visible_drafts``)."""

    rows: object  # the request's row of the request table
    seq: object  # the request's cached keys
    seen: list  # per draft column c: whether row r's mask shows draft c
    slots: list  # per draft column c: its place in the row's order (visible ones first, each part in draft order)
    count: object  # the drafts row r sees (itself among them)
    columns: object  # [rows, D]: the request table's columns of the drafts in that order


def visible_drafts(b: SpecBuilder, D: int, seq_lens, rpi, mask) -> Visible:
    """Per draft query, the drafts its tree-mask row shows: row r's mask entries of draft c at ``mask_indptr[i] +
    j * (seq_i + D) + seq_i + c``, counted, and a stable partition of the D columns (visible first, in order,
    then the hidden ones, as SGLang's sort writes it), unrolled over the D columns into per-row counts and
    selects: one fused kernel over the rows, no sort."""
    mask_indptr = b.cumsum(b.ewise("mul", b.ewise("add", seq_lens, D), D))
    req, j = sub_rows(b, D)
    seq = b.lookup(seq_lens, req)
    rows = b.lookup(rpi, req)
    # where row r's draft columns start in the flat mask (int64: the mask spans max_bs * D * (L + D))
    start = b.ewise("add", b.cast(b.ewise("add", b.ewise("mul", j, b.ewise("add", seq, D)), seq), I64),
                    b.cast(b.lookup(mask_indptr, req), I64))
    seen = [b.lookup(mask, b.ewise("add", start, c)) for c in range(D)]
    before, count = [], b.full(0, [f"{D}*bs"], I32)
    for c in range(D):  # visible columns before c: a visible column's slot among the visible ones
        before.append(count)
        count = b.ewise("add", count, b.cast(seen[c], I32))
    cols = b.arange(D)
    at = spread(b, seq, D)  # every entry of the row is overwritten below
    slots = []
    for c in range(D):
        # visible: after the visible ones before it; hidden: after every visible one and the hidden ones before
        slots.append(b.where(seen[c], before[c], b.ewise("add", b.ewise("sub", count, before[c]), c)))
        at = b.where(b.outer("eq", slots[c], cols), spread(b, b.ewise("add", seq, c), D), at)
    return Visible(rows, seq, seen, slots, count, at)
