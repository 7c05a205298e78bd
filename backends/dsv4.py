"""DeepSeek-V4-style compressed attention metadata (decode; IDLE replays it).

out_graph produces only the raw metadata: the batch rows (``req_pool_indices``,
``seq_lens``, ``out_cache_loc``) staged into static buffers. Everything else,
the raw->full upgrade, is declared here in out_graph as ``movable``, the way
an author ports it from eager code; ``hoist-upgrades`` records all of it into
the graph, and check-split rejects the spec (naming every step) if any of it
would stay out, because then compression would not run at replay. Padded and
IDLE rows are sequences of length 1 in pool row 0 writing slot 0, the same
substitution the engine makes for IDLE.

Page size 256 (two 128-token compressed slots per page), SWA window 128,
sparse top-k 512. Positions, windows and lengths are per request (T = 1).
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, SpecBuilder

from .common import decode_inputs

I32, I64 = DType.int32, DType.int64
PAGE, SWA, TOPK = 256, 128, 512
PAGES = f"ceiling(L/{PAGE})"


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"dsv4.{mode.name.lower()}")
    seq, rpi, req_to_token = decode_inputs(b)
    out_loc = b.input("out_cache_loc", I64, ["bs"], fill=0)
    full_to_swa = b.pool("full_to_swa", I32, ["N"])
    full = {}
    with b.out_graph(movable=True):
        pos = b.ewise("max", b.ewise("sub", seq, 1), 0)
        full["positions"] = b.cast(pos, I64)
        full["swa_topk_lengths"] = b.ewise("min", seq, SWA)
        tok = b.gather_rows(req_to_token, rpi, b.outer("sub", pos, b.arange(SWA)))  # -1 before token 0
        swa = b.lookup(full_to_swa, b.ewise("max", tok, 0))
        full["swa_page_indices"] = b.where(b.compare("ge", tok, 0), swa, -1)
        full["swa_out_cache_loc"] = b.lookup(full_to_swa, out_loc)
        pt = full["page_table"] = b.page_table(req_to_token, rpi, seq, page_size=PAGE, width=PAGES)
        for r in (4, 128):
            full[f"c{r}_lens"] = b.ewise("floordiv", seq, r)
            aligned = b.compare("eq", b.ewise("mod", seq, r), 0)
            full[f"c{r}_out_loc"] = b.where(aligned, b.ewise("floordiv", out_loc, r), 0)
            full[f"c{r}_positions"] = b.ewise("mul", b.ewise("floordiv", pos, r), r)
        j = b.arange(f"2*{PAGES}")  # compressed c128 slot j of a request: page j // 2, half j % 2
        zeros = b.full(0, ["bs"], I32)
        pages = b.gather_rows(pt, b.arange("bs", dtype=I64), b.outer("add", zeros, b.ewise("floordiv", j, 2)))
        slots = b.ewise("add", b.ewise("mul", pages, 2), b.outer("add", zeros, b.ewise("mod", j, 2)))
        full["c128_page_indices"] = b.where(b.outer("gt", full["c128_lens"], j), slots, -1)
        full["c4_sparse_topk_lengths"] = b.ewise("min", b.ewise("max", full["c4_lens"], 1), TOPK)
        full["c4_sparse_page_indices"] = b.full(-1, ["bs", TOPK], I32)  # filled later by the indexer's top-k
    b.outputs(**full)
    return b.build()


SPEC = BackendSpec("dsv4", build, (ForwardMode.DECODE,),
                   doc="DeepSeek-V4 compressed attention: the raw->full upgrade recorded in the graph")
