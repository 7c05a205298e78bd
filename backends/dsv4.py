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
sparse top-k 512. Decode has one query token per request; TARGET_VERIFY
expands to D tokens per request (causal lengths seq + 1 + j, pool rows
repeated) and runs the same upgrade per token, with a per-token
``out_cache_loc``. DRAFT_EXTEND is SWA-only (no compression) over T slots
per request, the accepted tokens first.
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Kind, SpecBuilder

from .common import decode_inputs, extend_lens, sub_rows, verify_headroom

I32, I64 = DType.int32, DType.int64
PAGE, SWA, TOPK = 256, 128, 512
PAGES = f"ceiling(L/{PAGE})"


def upgrade(b: SpecBuilder, seq, rpi, out_loc, req_to_token, full_to_swa, rows: str, compress: bool = True) -> dict:
    """raw -> full for ``rows`` query tokens: causal length, pool row and KV slot of each token.
    Without ``compress`` (draft extend) only the SWA fields and the page table."""
    full = {}
    pos = b.ewise("max", b.ewise("sub", seq, 1), 0)
    full["positions"] = b.cast(pos, I64)
    full["swa_topk_lengths"] = b.ewise("min", seq, SWA)
    tok = b.gather_rows(req_to_token, rpi, b.outer("sub", pos, b.arange(SWA)))  # -1 before token 0
    swa = b.lookup(full_to_swa, b.ewise("max", tok, 0))
    full["swa_page_indices"] = b.where(b.compare("ge", tok, 0), swa, -1)
    full["swa_out_cache_loc"] = b.lookup(full_to_swa, out_loc)
    full["page_table"] = b.page_table(req_to_token, rpi, seq, page_size=PAGE, width=PAGES)
    if not compress:
        return full
    for r in (4, 128):
        full[f"c{r}_lens"] = b.ewise("floordiv", seq, r)
        aligned = b.compare("eq", b.ewise("mod", seq, r), 0)
        full[f"c{r}_out_loc"] = b.where(aligned, b.ewise("floordiv", out_loc, r), 0)
        full[f"c{r}_positions"] = b.ewise("mul", b.ewise("floordiv", pos, r), r)
    j = b.arange(f"2*{PAGES}")  # compressed c128 slot j of a token: page j // 2, half j % 2
    zeros = b.full(0, [rows], I32)
    # page j // 2 as the page table holds it (its first token's slot // P), read from the pool rather
    # than from the page table, so the whole upgrade is one kernel instead of waiting for that table
    first = b.outer("add", zeros, b.ewise("mul", b.ewise("floordiv", j, 2), PAGE))
    pages = b.ewise("floordiv", b.gather_rows(req_to_token, rpi, first), PAGE)
    slots = b.ewise("add", b.ewise("mul", pages, 2), b.outer("add", zeros, b.ewise("mod", j, 2)))
    full["c128_page_indices"] = b.where(b.outer("gt", full["c128_lens"], j), slots, -1)
    full["c4_sparse_topk_lengths"] = b.clamp(full["c4_lens"], 1, TOPK)
    full["c4_sparse_page_indices"] = b.full(-1, [rows, TOPK], I32)  # filled later by the indexer's top-k
    return full


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"dsv4.{mode.name.lower()}")
    seq, rpi, req_to_token = decode_inputs(b, verify_headroom(mode, options))
    full_to_swa = b.pool("full_to_swa", I32, ["N"])
    if mode.is_draft_extend():  # T slots per request; token j of request b: the (j+1)-th accepted token
        T = options.num_draft_tokens
        ext = extend_lens(b)
        out_loc = b.input("out_cache_loc", I64, [f"{T}*bs"], fill=0, kind=Kind.slot)
        with b.out_graph(movable=True):
            own, t = sub_rows(b, T)
            seq_own = b.lookup(seq, own)
            first = b.ewise("add", b.ewise("sub", seq_own, b.lookup(ext, own)), 1)  # the first accepted token's
            # slots past a request's accepted tokens repeat its last token (clamped to seq_lens)
            seq_tok = b.ewise("min", b.ewise("add", first, t), seq_own)
            full = upgrade(b, seq_tok, b.lookup(rpi, own), out_loc, req_to_token, full_to_swa, f"{T}*bs",
                           compress=False)
    elif mode.is_target_verify():  # D query tokens per request: token j of request b sees seq_b + 1 + j keys
        D = options.num_draft_tokens
        out_loc = b.input("out_cache_loc", I64, [f"{D}*bs"], fill=0, kind=Kind.slot)
        with b.out_graph(movable=True):
            own, t = sub_rows(b, D)
            seq_tok = b.ewise("add", b.ewise("add", b.lookup(seq, own), 1), t)
            full = upgrade(b, seq_tok, b.lookup(rpi, own), out_loc, req_to_token, full_to_swa, f"{D}*bs")
    else:
        out_loc = b.input("out_cache_loc", I64, ["bs"], fill=0, kind=Kind.slot)
        with b.out_graph(movable=True):
            full = upgrade(b, seq, rpi, out_loc, req_to_token, full_to_swa, "bs")
    b.outputs(**full)
    return b.build()


SPEC = BackendSpec("dsv4", build, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                   doc="DeepSeek-V4 compressed attention: the raw->full upgrade recorded in the graph",
                   headroom=verify_headroom)
