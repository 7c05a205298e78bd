"""DeepSeek-V4's compressor plans: where each c4 / c128 compressor reads and writes its state ring,
as SGLang 0.5.23's paged compress planner builds them (one plan per ratio and step).

A compressor keeps the last tokens of each request in a state ring of ``ring`` rows: c4 a ring of
8 (16 with speculative decoding) addressed through the SWA slot of the token (SWA page * ring +
slot % ring), c128 a ring of 128 (256 with speculation) per request row (row * ring + pos % ring).
Every plan entry is a row of int32 words; ``.view(torch.uint8)`` is SGLang's byte layout:

- decode, ``c{r}_plan_d`` [bs, 4]: (seq_len, write_loc, read_page_0, read_page_1) for the token at
  position seq - 1 (read pages: the ring pages of positions max(p - r, 0) and p).
- target verify, ``c{r}_plan_c`` [D*bs, 4]: one entry per query token that completes a compressed
  block ((p + 1) % r == 0): (p + 1, ragged_id | buffer_len << 16, read_page_0, read_page_1), where
  ``buffer_len`` counts the window's tokens that come from the ring rather than this step (read
  pages -1 and the request index when it is 0); ``c{r}_plan_w`` [D*bs, 2]: (ragged_id,
  write_loc) for each token the ring must keep. Entries come in token order; the rest are the
  invalid entry, (-1, 0, -1, -1) and (-1, -1).

Everything is computed in the recorded graph: compaction is a sort of the tokens keyed by
(not kept, token index), so no step reads a count on the host.
"""

from __future__ import annotations

from attnmeta.compiler.ir import DType, SpecBuilder, V
from attnmeta.runtime.metadata import ratio_prefix

I32 = DType.int32
SWA_PAGE = 256  # SGLang's SWA page size: a page holds whole c4 windows


def ring_size(ratio: int, speculative: bool) -> int:
    """Rows of a request's (c128) or SWA page's (c4) state ring: wider under speculation, so a
    rejected draft never overwrites a token a later compression still reads."""
    return {4: 16, 128: 256}[ratio] if speculative else {4: 8, 128: 128}[ratio]


def speculative(modes) -> bool:
    """Whether a backend compiled for ``modes`` serves speculative decoding (its rings are wider)."""
    return any(m.is_target_verify() or m.is_draft_extend() for m in modes)


def window(ratio: int) -> int:
    """Tokens one compression reads: c4 windows overlap by one block."""
    return 2 * ratio if ratio == 4 else ratio


def _bc(b: SpecBuilder, x: V, width: int) -> V:
    """[n] -> [n, width], every column x."""
    return b.outer("add", x, b.full(0, [width], x.type.dtype))


def _col(b: SpecBuilder, n, width: int) -> V:
    """[n, width]: each entry's column index."""
    return b.outer("add", b.full(0, [n], I32), b.arange(width))


class _Ring:
    """Ring slots of one ratio over [n, w] positions: ``loc(P)`` where each position's state lives.
    Plans are built whole as [n, w] matrices so one kernel computes every word of a row."""

    def __init__(self, b: SpecBuilder, ratio: int, ring: int, rid: V, req_to_token: V, full_to_swa: V):
        self.b, self.r, self.ring, self.rid = b, ratio, ring, rid
        self.req_to_token, self.full_to_swa = req_to_token, full_to_swa

    def loc(self, P: V) -> V:
        b, ring = self.b, self.ring
        if self.r == 128:  # one ring per request row
            base = _bc(b, b.ewise("mul", self.rid, ring), P.type.shape[1])
            return b.ewise("add", base, b.ewise("mod", P, ring))
        s = b.lookup(self.full_to_swa, b.gather_rows(self.req_to_token, self.rid, P))  # the SWA slot
        return b.ewise("add", b.ewise("mul", b.ewise("floordiv", s, SWA_PAGE), ring), b.ewise("mod", s, ring))

    def pages(self, kk: V, p1: V, P1: V) -> V:
        """[n, 4] ring locations: column 2 of position max(p1 - r, 0), the others of p1 (P1: [n, 4])."""
        b = self.b
        p0 = b.ewise("max", b.ewise("sub", p1, self.r), 0)
        return self.loc(b.where(b.compare("eq", kk, 2), _bc(b, p0, 4), P1))


def decode_plans(b: SpecBuilder, seq: V, p1: V, rpi: V, req_to_token: V, full_to_swa: V,
                 speculative: bool, ratios: tuple[int, ...] = (4, 128)) -> dict:
    """``c{r}_plan_d`` of each of ``ratios`` for one token per request at position ``p1`` = seq - 1."""
    kk, rid, P1, first = _col(b, "bs", 4), b.cast(rpi, I32), _bc(b, p1, 4), _bc(b, seq, 4)
    out = {}
    for r in ratios:
        loc = _Ring(b, r, ring_size(r, speculative), rid, req_to_token, full_to_swa).pages(kk, p1, P1)
        words = b.where(b.compare("eq", kk, 1), loc, b.ewise("floordiv", loc, r))
        out[ratio_prefix(r) + "plan_d"] = b.where(b.compare("eq", kk, 0), first, words)
    return out


def _compact(b: SpecBuilder, n: str, keep: list[V], rows: list[V], invalid: list[tuple[int, ...]],
             max_rows: int) -> list[V]:
    """Each ``rows[i]`` [n, w] keeping the rows where ``keep[i]``, in token order, then ``invalid``
    rows. One sort orders every plan: row i of the sorted keys holds plan i's kept tokens first.
    A token's key is its index, plus top (a power of two above any index) when it is not kept."""
    top = 1 << max_rows.bit_length()
    k, m = b.arange(n), len(keep)
    keys = [b.outer("add", b.full(0, [m], I32), b.where(c, k, b.ewise("add", k, top))) for c in keep]
    which = b.outer("add", b.arange(m), b.full(0, [n], I32))
    stacked = keys[-1]
    for i in range(m - 2, -1, -1):
        stacked = b.where(b.compare("eq", which, i), keys[i], stacked)
    flat = b.flatten(b.op("sort_rows", stacked))
    out = []
    for i, (mat, inv) in enumerate(zip(rows, invalid, strict=True)):
        order = b.slice(flat, f"{i}*{n}", f"{i + 1}*{n}")
        w = mat.type.shape[1]
        kk = _col(b, n, w)
        kept = b.outer("lt", order, b.full(top, [w], I32))
        fill = b.full(inv[-1], [n, w], I32)
        for c in range(len(inv) - 2, -1, -1):
            fill = b.where(b.compare("eq", kk, c), b.full(inv[c], [n, w], I32), fill)
        out.append(b.where(kept, b.gather_rows(mat, b.ewise("mod", order, top), kk), fill))
    return out


def verify_plans(b: SpecBuilder, D: int, own: V, j: V, seq: V, rpi: V, req_to_token: V, full_to_swa: V,
                 speculative: bool, max_bs: int, ratios: tuple[int, ...] = (4, 128)) -> dict:
    """``c{r}_plan_c`` / ``c{r}_plan_w`` of each of ``ratios`` for D query tokens per request at
    positions seq .. seq + D - 1 (token z = request own[z], index j[z]), the planner's uniform-extend path."""
    if not ratios:
        return {}
    n = f"{D}*bs"
    seq_r, rid = b.lookup(seq, own), b.cast(b.lookup(rpi, own), I32)
    pos = b.ewise("add", seq_r, j)
    end = b.ewise("add", seq_r, D)  # the request's length after this step
    k, kk, kw = b.arange(n), _col(b, n, 4), _col(b, n, 2)
    P, P2, head = _bc(b, pos, 4), _bc(b, pos, 2), _bc(b, b.ewise("add", pos, 1), 4)
    keep, rows, names = [], [], []
    for r in ratios:
        size = ring_size(r, speculative)
        ring = _Ring(b, r, size, rid, req_to_token, full_to_swa)
        w = window(r)
        buf = b.ewise("sub", b.full(w, [n], I32), b.ewise("min", b.ewise("add", j, 1), w))
        loc = ring.pages(kk, pos, P)
        # read pages come from the ring only when part of the window is there (buf > 0)
        pages = b.where(b.outer("gt", buf, b.full(0, [4], I32)), b.ewise("floordiv", loc, r),
                        b.where(b.compare("eq", kk, 2), b.full(-1, [n, 4], I32), _bc(b, own, 4)))
        words = b.where(b.compare("eq", kk, 0), head, _bc(b, b.ewise("add", k, b.ewise("mul", buf, 1 << 16)), 4))
        keep.append(b.compare("eq", b.ewise("mod", b.ewise("add", pos, 1), r), 0))  # completes a block
        rows.append(b.where(b.compare("lt", kk, 2), words, pages))
        pad = size - w + 2 if size > w else 0  # trailing tokens kept for a later rollback
        last = b.ewise("mul", b.ewise("floordiv", end, r), r)
        first = b.ewise("min", b.ewise("sub", last, r if r == 4 else 0), b.ewise("sub", end, pad))
        kept = b.compare("ge", pos, first)
        if r == 4:  # an overlapping window crosses SWA pages: the page's last block stays too
            kept = b.where(kept, kept, b.compare("ge", b.ewise("mod", pos, SWA_PAGE), SWA_PAGE - r))
        keep.append(kept)
        rows.append(b.where(b.compare("eq", kw, 0), _bc(b, k, 2), ring.loc(P2)))
        names += [ratio_prefix(r) + "plan_c", ratio_prefix(r) + "plan_w"]
    invalid = [(-1, 0, -1, -1), (-1, -1)] * len(ratios)
    return dict(zip(names, _compact(b, n, keep, rows, invalid, max_bs * D), strict=True))
