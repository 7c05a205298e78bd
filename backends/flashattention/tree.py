"""EAGLE with topk > 1 on FlashAttention: the draft tree's attention in two parts merged by their LSE, as FA3
runs it: the prefix (the cached keys, decode's page table) and an expansion with one row per draft query over
the drafted tokens it may see, by token slot (``expand_*`` fields, SGLang's ``forward_metadata_spec_decode_expand``).

The verify's expansion picks and orders a few columns per row (at most D); the selection is unrolled over those
columns into per-row counts and selects, so it is one fused kernel over its rows, with no sort. The drafter's
branches are page-aligned regions of the request table, read as page tables are.
"""

from __future__ import annotations

from attnmeta.compiler import CompileOptions
from attnmeta.compiler.ir import DType, Graph, Kind, Placement, SpecBuilder
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime.metadata import step_prefix

from ..common import decode_inputs, sub_rows, verify_mask
from ..multistep import headroom
from ..tree import spread as _spread
from ..tree import visible_drafts

I32, I64 = DType.int32, DType.int64


def tree_verify(b: SpecBuilder, options: CompileOptions, seq_lens, rpi, req_to_token) -> Graph:
    """Target verify with EAGLE topk > 1, as FA3 runs it: two attentions merged by their LSE.

    - The prefix: each request's D queries over its seq_lens cached keys (no drafts), pages as decode's.
    - The drafts (``expand_*``): one row per draft query, r = i * D + j. Its keys are the drafts its tree-mask
      row allows, in draft order: key c of row r is visible when the mask holds at
      ``mask_indptr[i] + j * (seq_i + D) + seq_i + c``. ``expand_page_table[r]`` lists those drafts' token
      slots first, in order, then the hidden ones (a stable partition of the D columns, written for every
      column as SGLang's sort writes it); ``expand_cache_seqlens_int32[r]`` counts the visible ones.

    The stable partition is unrolled over the D columns (D is small: the draft tokens) into per-row
    counts and selects, so the whole expansion is one fused kernel over the bs * D rows, with no sort."""
    D, P = options.num_draft_tokens, options.page_size
    if options.sliding_window and P > 1:
        raise OptionsError(f"flashattention: a sliding window under EAGLE topk > 1 is planned at page size 1 (as "
                           f"SGLang plans its merged window), not {P} (--page-size)")
    with b.in_graph():
        cache_seqlens = b.copy(seq_lens, name="cache_seqlens_int32")
        cu_seqlens_q = b.arange("bs + 1", step=D, name="cu_seqlens_q")
        cu_seqlens_k = b.cumsum(seq_lens, name="cu_seqlens_k")
        page_table = b.page_table(req_to_token, rpi, seq_lens, page_size=P, width="W", name="page_table")
        mask = verify_mask(b, D)  # the drafter's tree mask, written into this field before the step
        t = visible_drafts(b, D, seq_lens, rpi, mask)
        rows, seq, seen, slots, count = t.rows, t.seq, t.seen, t.slots, t.count
        expand_page_table = b.gather_rows(req_to_token, rows, t.columns, name="expand_page_table")
        expand_lens = b.copy(count, name="expand_cache_seqlens_int32")
        expand_cu_k = b.cumsum(count, name="expand_cu_seqlens_k")
        expand_cu_q = b.arange(f"{D}*bs + 1", name="expand_cu_seqlens_q")
        window = _window(b, options, req_to_token, rows, seq, seen, slots, count) if options.sliding_window else {}
    with b.out_graph():
        max_q = b.full(D, [], I32, Placement.host, name="max_seq_len_q")
        max_k = b.full(options.max_context_len, [], I32, Placement.host, name="max_seq_len_k")
    b.outputs(cache_seqlens_int32=cache_seqlens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
              page_table=page_table, max_seq_len_q=max_q, max_seq_len_k=max_k, custom_mask=mask,
              expand_cache_seqlens_int32=expand_lens, expand_cu_seqlens_q=expand_cu_q,
              expand_cu_seqlens_k=expand_cu_k, expand_page_table=expand_page_table, **window)
    return b.build()


def _window(b: SpecBuilder, options: CompileOptions, req_to_token, rows, seq, seen, slots, count) -> dict:
    """The window layers' attention of a tree verify (SGLang's ``swa_spec_metadata``): FA3 applies a window to one
    sequence, so each draft query row gets one, its request's cached keys followed by the drafts its tree-mask
    row shows, in the expansion's order (``swa_spec_*``: keys ``seq + visible``, their running sum, and the
    token slots of that sequence, page size 1 as SGLang plans it); with a window pool those slots and the drafts'
    write slots translated into it."""
    D = options.num_draft_tokens
    width = options.max_context_len + D
    rows_n = f"{D}*bs"
    cc = b.arange(width)
    col = b.where(b.outer("gt", seq, cc), b.outer("add", b.full(0, [rows_n], DType.int32), cc),
                  _spread(b, b.full(-1, [rows_n], DType.int32), width))  # the cached keys, in order
    for c in range(D):  # a visible draft at the prefix's end plus its slot among the visible ones
        at = b.where(seen[c], b.ewise("add", seq, slots[c]), b.full(-1, [rows_n], DType.int32))
        col = b.where(b.outer("eq", at, cc), _spread(b, b.ewise("add", seq, c), width), col)
    keys = b.ewise("add", seq, count, name="swa_spec_cache_seqlens_int32")
    out = {"swa_spec_cache_seqlens_int32": keys, "swa_spec_cu_seqlens_k": b.cumsum(keys, name="swa_spec_cu_seqlens_k")}
    if not options.window_pool:
        out["swa_spec_page_table"] = b.gather_rows(req_to_token, rows, col, name="swa_spec_page_table")
        return out
    # the window layers' KV in a pool of their own: the same sequence's slots there, and the drafts' write slots
    full_to_swa = b.pool("full_to_swa", DType.int64, ["N"])
    out_loc = b.input("out_cache_loc", DType.int64, [rows_n], fill=0, kind=Kind.slot)
    out["swa_spec_page_table"] = b.cast(b.lookup(full_to_swa, b.gather_rows(req_to_token, rows, col)), DType.int32,
                                        name="swa_spec_page_table")
    out["swa_out_cache_loc"] = b.lookup(full_to_swa, out_loc, name="swa_out_cache_loc")
    return out


def tree_draft(b: SpecBuilder, options: CompileOptions) -> Graph:
    """EAGLE's multi-step draft decode with K = topk > 1 branches, every step s of a round (the drafter's
    children, s < S - 1) in one graph.

    - The prefix, the same for every step: each request's K queries (one per branch) over its cached keys,
      up to the last whole page (``seq - seq % P``); the partial last page goes with the branches, which
      hold their own copy of it.
    - Step s's branches (``step<s>_expand_*``), one row per branch r = i * K + k: its keys are the
      ``seq % P`` copied tokens and the s + 1 drafted so far. EAGLE's worker writes each branch's slots into
      the request's row after the prefix, from the page-aligned column ``floor(seq / P) * P + k * stride``
      (``stride = ceil((seq % P + S) / P) * P``; ``seq + k * S`` for page size 1), the copied tokens first
      (``out_cache_loc`` holds the same draft slots): the branch's page table is that region's pages, read
      from the request table as the prefix's are, so a replay reads only the engine's pools.
    ``cu_seqlens_k`` of the prefix is its running sum, and the branches' a constant stride of s + 1, as SGLang
    sets them; FA3 reads neither (the key lengths and page tables bound its reads)."""
    K, S, P = options.topk, options.num_steps, options.page_size
    seq_lens, rpi, req_to_token = decode_inputs(b, headroom(None, options))
    out = {}
    with b.in_graph():
        last = b.ewise("mod", seq_lens, P) if P > 1 else None
        prefix = b.ewise("sub", seq_lens, last) if P > 1 else seq_lens
        out["cache_seqlens_int32"] = b.copy(prefix, name="cache_seqlens_int32")
        out["cu_seqlens_q"] = b.arange("bs + 1", step=K, name="cu_seqlens_q")
        out["cu_seqlens_k"] = b.cumsum(prefix, name="cu_seqlens_k")
        out["page_table"] = b.page_table(req_to_token, rpi, prefix, page_size=P, width="W", name="page_table")
        out["expand_cu_seqlens_q"] = b.arange(f"{K}*bs + 1", name="expand_cu_seqlens_q")
        req, k = sub_rows(b, K)
        rows, start = b.lookup(rpi, req), b.lookup(prefix, req)
        if P > 1:  # the branch's region: page-aligned, after the prefix's whole pages
            tail = b.lookup(last, req)
            stride = b.ewise("mul", b.ewise("ceildiv", b.ewise("add", tail, S), P), P)
            start = b.ewise("add", start, b.ewise("mul", k, stride))
        else:
            start = b.ewise("add", start, b.ewise("mul", k, S))
        for s in range(S - 1):  # step s reads the first s + 1 drafts
            p = step_prefix(s)
            # SGLang's width: s + 1 columns, one more for the copied partial page when a page holds more than a token
            n = s + 1 + (P > 1)
            slots = b.gather_rows(req_to_token, rows, b.outer("add", start, b.arange(n, step=P)))
            out[p + "expand_page_table"] = b.ewise("floordiv", slots, P) if P > 1 else slots
            lens = b.full(s + 1, [f"{K}*bs"], I32)
            out[p + "expand_cache_seqlens_int32"] = b.ewise("add", lens, tail) if P > 1 else b.copy(lens)
            out[p + "expand_cu_seqlens_k"] = b.arange(f"{K}*bs + 1", step=s + 1)
    with b.out_graph():
        out["max_seq_len_q"] = b.full(K, [], I32, Placement.host)
    b.outputs(**out)
    return b.build()
