"""DeepSeek-V4 compressed attention metadata, field for field as SGLang's DSV4 backend hands
it to its attention, compressor and indexer kernels (decode; IDLE replays it).

out_graph produces only the raw metadata: the batch rows (``req_pool_indices``,
``seq_lens``, ``out_cache_loc``) staged into static buffers. Everything else,
the raw->full upgrade, is declared here in out_graph as ``movable``, the way
an author ports it from eager code; ``hoist-upgrades`` records all of it into
the graph, and check-split rejects the spec (naming every step) if any of it
would stay out, because then compression would not run at replay. Padded and
IDLE rows are sequences of length 1 in pool row 0 writing slot 0, the same
substitution the engine makes for IDLE.

Every query token gets a causal length ``seq_lens_casual`` (the keys it sees) and
``positions = seq_lens_casual - 1``. Decode: one token per request. TARGET_VERIFY: D
tokens per request at ``seq + 1 .. seq + D``. DRAFT_EXTEND (SGLang's V2 layout): T = D
tokens per request at ``seq - T + 1 .. seq``, SWA only (no compression); for a request
shorter than T the first tokens have lengths <= 0 and read nothing, as in the engine. Its
page table, which no draft-extend kernel reads, keeps the full width (SGLang passes a
one-page placeholder; a narrower table is what check-split's buffer-capacity rule refuses).

Page size 256 (two 128-token compressed slots per page), SWA window 128, c4 and c128
compression (``compress_ratios``, a compile option: the ratios the model's pool has; SGLang builds
nothing for a ratio outside them, and neither does this spec), the indexer's top-k
``index_topk`` (512 or 1024, a compile option). Widths of the index tables the sparse kernels
read are padded to a multiple of 64 with -1.
Lengths handed to the attention kernel are clamped to at least 1 (``*_clamp1``): an
empty compressed history is one masked entry for the kernel.
"""

from __future__ import annotations

import attrs

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, OptionsError
from attnmeta.compiler.ir import DType, Graph, Kind, SpecBuilder
from attnmeta.runtime.metadata import ratio_prefix

from ..common import decode_inputs, sub_rows, verify_headroom
from .compress import decode_plans, speculative, verify_plans
from .indexer import indexer_schedule

I32, I64 = DType.int32, DType.int64


def _ratios(xs) -> tuple[int, ...]:
    return tuple(sorted({int(x) for x in xs}))


@attrs.frozen
class DSV4Options:
    """DeepSeek-V4's own options (``CompileOptions(backend=DSV4Options(...))``)."""

    index_topk: int = 512  # compressed entries the indexer selects per query (the model's index_topk)
    # the compression ratios the model's KV pool has (SGLang's present_ratios); the others' fields are not built
    compress_ratios: tuple[int, ...] = attrs.field(default=(4, 128), converter=_ratios)

    def __attrs_post_init__(self) -> None:
        if self.index_topk not in (512, 1024) or isinstance(self.index_topk, bool):  # what the sparse kernels take
            raise OptionsError(f"index_topk must be 512 or 1024 (the model config's index_topk), got "
                               f"{self.index_topk!r} (--index-topk)")
        if not set(self.compress_ratios) <= {4, 128}:  # DeepSeek-V4.1's c1/c2 are not planned
            raise OptionsError(f"compress_ratios must be drawn from 4 and 128 (DeepSeek-V4's ratios), got "
                               f"{list(self.compress_ratios)} (--compress-ratios)")
PAGE, SWA, ALIGN = 256, 128, 64
PAGES = f"ceiling(L/{PAGE})"
C128_WIDTH = f"{ALIGN}*ceiling(2*{PAGES}/{ALIGN})"  # two c128 slots per page, padded to 64


def upgrade(b: SpecBuilder, seq, rpi, out_loc, req_to_token, full_to_swa, rows: str, topk: int,
            ratios: tuple[int, ...]) -> dict:
    """raw -> full for ``rows`` query tokens of causal lengths ``seq`` (pool rows ``rpi``, KV
    slots ``out_loc``), with the compressed fields of each of ``ratios`` (none in draft extend:
    only the SWA fields and the page table)."""
    full = {"seq_lens_casual": b.copy(seq), "raw_out_loc": b.copy(out_loc)}
    pos = b.ewise("sub", seq, 1)
    full["positions"] = pos
    full["swa_topk_lengths"] = b.ewise("min", seq, SWA)
    tok = b.gather_rows(req_to_token, rpi, b.outer("sub", pos, b.arange(SWA)))  # -1 before token 0
    swa = b.lookup(full_to_swa, b.ewise("max", tok, 0))
    full["swa_page_indices"] = b.where(b.compare("ge", tok, 0), swa, -1)
    full["swa_out_cache_loc"] = b.lookup(full_to_swa, out_loc)
    full["page_table"] = b.page_table(req_to_token, rpi, seq, page_size=PAGE, width=PAGES)
    raw = {r: b.ewise("floordiv", seq, r) for r in ratios}  # completed compressed blocks
    for r in ratios:
        if r == 4:
            full["c4_topk_lengths_raw"] = raw[4]
        full[ratio_prefix(r) + "topk_lengths_clamp1"] = b.ewise("max", raw[r], 1)
        aligned = b.compare("eq", b.ewise("mod", seq, r), 0)  # this token completes a compressed block
        full[ratio_prefix(r) + "out_loc"] = b.where(aligned, b.ewise("floordiv", out_loc, r), 0)
    if 128 in ratios:
        full["c128_page_indices"] = _c128_pages(b, raw[128], rpi, req_to_token, rows)
    if 4 in ratios:
        full["c4_sparse_topk_lengths"] = b.clamp(raw[4], 1, topk)
        full["c4_sparse_page_indices"] = b.full(-1, [rows, topk], I32)  # filled per layer by the indexer's top-k
    return full


def _c128_pages(b: SpecBuilder, blocks, rpi, req_to_token, rows: str):
    """Each token's compressed c128 slots: slot j is half j % 2 of page j // 2, -1 from ``blocks`` on."""
    j = b.arange(C128_WIDTH)  # compressed c128 slot j of a token: page j // 2, half j % 2
    zeros = b.full(0, [rows], I32)
    # page j // 2 as the page table holds it (its first token's slot // P), read from the pool rather
    # than from the page table, so the whole upgrade is one kernel instead of waiting for that table
    first = b.outer("add", zeros, b.ewise("mul", b.ewise("floordiv", j, 2), PAGE))
    pages = b.ewise("floordiv", b.gather_rows(req_to_token, rpi, first), PAGE)
    slots = b.ewise("add", b.ewise("mul", pages, 2), b.outer("add", zeros, b.ewise("mod", j, 2)))
    return b.where(b.outer("gt", blocks, j), slots, -1)


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"dsv4.{mode.name.lower()}")
    seq, rpi, req_to_token = decode_inputs(b, verify_headroom(mode, options))
    full_to_swa = b.pool("full_to_swa", I32, ["N"])
    own = options.of(DSV4Options)
    topk, ratios = own.index_topk, own.compress_ratios
    if 4 in ratios and options.sm_count < 1:
        raise OptionsError("dsv4's c4 indexer schedule splits work over the device's SMs: sm_count must be >= 1 "
                           f"(got {options.sm_count}; --sm-count)")
    spec = speculative(options.modes)
    if mode.is_draft_extend():  # V2: T tokens per request, token t at causal length seq - T + 1 + t
        T = options.num_draft_tokens
        out_loc = b.input("out_cache_loc", I64, [f"{T}*bs"], fill=0, kind=Kind.slot)
        with b.out_graph(movable=True):
            own, t = sub_rows(b, T)
            seq_tok = b.ewise("add", b.ewise("sub", b.lookup(seq, own), T - 1), t)
            full = upgrade(b, seq_tok, b.lookup(rpi, own), out_loc, req_to_token, full_to_swa, f"{T}*bs", topk, ())
    elif mode.is_target_verify():  # D query tokens per request: token j of request b sees seq_b + 1 + j keys
        D = options.num_draft_tokens
        out_loc = b.input("out_cache_loc", I64, [f"{D}*bs"], fill=0, kind=Kind.slot)
        with b.out_graph(movable=True):
            own, t = sub_rows(b, D)
            seq_tok = b.ewise("add", b.ewise("add", b.lookup(seq, own), 1), t)
            full = upgrade(b, seq_tok, b.lookup(rpi, own), out_loc, req_to_token, full_to_swa, f"{D}*bs", topk,
                           ratios)
            full |= verify_plans(b, D, own, t, seq, rpi, req_to_token, full_to_swa, spec, options.max_bs, ratios)
            if 4 in ratios:
                full["c4_indexer_schedule"] = indexer_schedule(b, full["c4_topk_lengths_raw"], options.sm_count,
                                                               options.max_bs * D)
    else:
        out_loc = b.input("out_cache_loc", I64, ["bs"], fill=0, kind=Kind.slot)
        with b.out_graph(movable=True):
            full = upgrade(b, seq, rpi, out_loc, req_to_token, full_to_swa, "bs", topk, ratios)
            full |= decode_plans(b, seq, full["positions"], rpi, req_to_token, full_to_swa, spec, ratios)
            if 4 in ratios:
                full["c4_indexer_schedule"] = indexer_schedule(b, full["c4_topk_lengths_raw"], options.sm_count,
                                                               options.max_bs)
    b.outputs(**full)
    return b.build()


SPEC = BackendSpec("dsv4", build, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                   doc="DeepSeek-V4 compressed attention: the raw->full upgrade recorded in the graph",
                   headroom=verify_headroom, options_type=DSV4Options)
