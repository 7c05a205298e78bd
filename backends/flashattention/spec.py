"""FlashAttention metadata (decode, target verify, draft extend), declared once; TRT-LLM MHA's is the same but
for draft extend.

The page table has a static width W = ceil(L / P) and guards each row on
device (pages past ceil(seq_len / P) are 0), so no host maximum is baked
into the captured graph. ``max_seq_len_q`` is the per-mode constant (1, or the
draft tokens) and ``max_seq_len_k`` the static bound L: constants, not per-step
host numbers.
"""

from __future__ import annotations

import math

import attrs

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Kind, Placement, SpecBuilder
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime.metadata import step_prefix

from ..common import decode_inputs, extend_lens, verify_headroom
from ..multistep import headroom as branch_headroom
from .tree import tree_draft, tree_verify

I32, I64 = DType.int32, DType.int64


@attrs.frozen
class FlashAttentionOptions:
    """FlashAttention's own options (``CompileOptions(backend=FlashAttentionOptions(...))``)."""

    # chunked local attention (Llama 4's iRoPE layers): those layers attend within fixed chunks of this many
    # tokens, each request's current chunk a batch item of its own (0: none; the model's attention_chunk_size)
    attention_chunk: int = 0

    def __attrs_post_init__(self) -> None:
        c = self.attention_chunk
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise OptionsError(f"attention_chunk must be an int >= 0 (tokens; 0: none), got {c!r} (--attention-chunk)")


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    return _build("flashattention", mode, options, strided_extend=False)


def build_trtllm_mha(mode: ForwardMode, options: CompileOptions) -> Graph:
    """TRT-LLM MHA (SGLang's ``trtllm_mha``): FlashAttention's fields, the same formulas; its draft extend
    (V2) gives every request the same T query slots (``cu_seqlens_q`` strided by T, as SGLang's graph
    metadata kernel writes it) instead of each request's accepted tokens."""
    return _build("trtllm_mha", mode, options, strided_extend=True)


def _build(name: str, mode: ForwardMode, options: CompileOptions, strided_extend: bool) -> Graph:
    b = SpecBuilder(f"{name}.{mode.name.lower()}")
    seq_lens, rpi, req_to_token = decode_inputs(b, verify_headroom(mode, options))
    chunk = options.of(FlashAttentionOptions).attention_chunk if name == "flashattention" else 0
    if chunk:
        planned_chunks(mode, options, chunk)  # what it does not plan is refused by name, before a tree is built
    if mode.is_target_verify() and options.topk > 1 and not strided_extend:
        return tree_verify(b, options, seq_lens, rpi, req_to_token)
    T = options.num_draft_tokens if mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND) else 1
    ext = extend_lens(b) if mode.is_draft_extend() and not strided_extend else None
    with b.in_graph():
        # verify: the D draft tokens' keys are in the cache too, after the prefix
        kv_lens = b.ewise("add", seq_lens, T) if mode.is_target_verify() else seq_lens
        cache_seqlens = b.copy(kv_lens, name="cache_seqlens_int32")
        if ext is None:
            cu_seqlens_q = b.arange("bs + 1", step=T, name="cu_seqlens_q")
        else:  # draft extend: queries are the accepted tokens, at most T per request
            cu_seqlens_q = b.cumsum(ext, name="cu_seqlens_q")
        cu_seqlens_k = b.cumsum(kv_lens, name="cu_seqlens_k")
        page_table = b.page_table(req_to_token, rpi, kv_lens, page_size=options.page_size, width="W",
                                  name="page_table")
    win = window_pool(b, page_table, options, f"{T}*bs") if options.window_pool else {}
    if chunk:
        win |= local_chunks(b, kv_lens, win.get("swa_page_table", page_table), T, options, chunk)
    with b.out_graph():
        max_q = b.full(T, [], I32, Placement.host, name="max_seq_len_q")
        max_k = b.full(options.max_context_len, [], I32, Placement.host, name="max_seq_len_k")
    b.outputs(cache_seqlens_int32=cache_seqlens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
              page_table=page_table, max_seq_len_q=max_q, max_seq_len_k=max_k, **win)
    return b.build()


def local_chunks(b: SpecBuilder, kv_lens, table, Q: int, options: CompileOptions, C: int) -> dict:
    """Chunked local attention (SGLang's ``LocalAttentionMetadataBuilder``): each request's queries, its last ``Q``
    tokens of ``kv_lens`` keys, attend within fixed chunks of ``C`` tokens, and each chunk a request's queries fall
    in is one batch item. Decode's one query is in one chunk; verify's D queries may run into the next: the queries
    of request r and its j-th chunk from the first query's (``V`` per request, ceil((Q - 1) / C) + 1) are item
    r * V + j, with that chunk's queries (``local_query_start_loc``, an indptr), its keys up to its last query
    (``local_seqused_k``), and its pages, C / P columns of ``table`` (the window pool's where the chunked layers keep
    their KV there), clamped to the table's last as SGLang clamps them (the kernel reads ceil(keys / P)). A chunk no
    query reaches is an empty item (no queries, no keys), so the layout is static; SGLang's host code lists only
    the others, in the same order."""
    P = options.page_size
    last, V = math.ceil(options.max_context_len / P) - 1, 1 + math.ceil((Q - 1) / C)
    with b.in_graph():
        first = b.ewise("sub", kv_lens, Q)  # the first query's position
        off = b.ewise("mod", first, C)  # its place in its chunk
        start = b.outer("add", b.ewise("sub", first, off), b.arange(V, step=C))  # chunk j's first token, [bs, V]
        # item j holds the queries at offsets [lo, lo + C) from the first query, lo = jC - off
        neg_lo = b.outer("sub", off, b.arange(V, step=C))
        lo = b.ewise("mul", neg_lo, -1)
        q_end = b.ewise("min", b.ewise("add", lo, C), Q)
        q = b.ewise("max", b.ewise("sub", q_end, b.ewise("max", lo, 0)), 0)
        # keys: the chunk's tokens up to its last query (the whole chunk but in the last), none in an empty item
        keys = b.where(b.compare("gt", q, 0), b.ewise("min", b.ewise("add", neg_lo, Q), C), 0)
        cols = b.clamp(b.outer("add", b.ewise("floordiv", b.flatten(start), P), b.arange(C // P)), 0, last)
        rows = b.repeat(b.arange("bs"), V)
        return {"local_query_start_loc": b.cumsum(b.flatten(q), name="local_query_start_loc"),
                "local_seqused_k": b.flatten(keys, name="local_seqused_k"),
                "local_block_table": b.gather_rows(table, rows, cols, name="local_block_table")}


def planned_chunks(mode: ForwardMode, options: CompileOptions, C: int) -> None:
    """Refuses chunked local attention where it is not planned: a tree verify (its drafts' chunks are per branch) and
    draft extend (a draft model's layers; SGLang's own fa3 builds no chunk for either); a chunk off page bounds."""
    if not (mode.is_decode() or (mode.is_target_verify() and options.topk <= 1)):
        what = "target_verify with topk > 1 (a tree)" if mode.is_target_verify() else mode.name.lower()
        raise OptionsError(f"flashattention: chunked local attention is planned for decode and target_verify at "
                           f"topk 1, not {what}; SGLang's own fa3 plans no chunk there either: serve it with SGLang's "
                           f"own fa3, or compile the target with modes decode,idle,target_verify and topk 1")
    if C % options.page_size:
        raise OptionsError(f"attention_chunk={C} is not a multiple of the page size {options.page_size}: a chunk "
                           f"must start on a page (--attention-chunk, --page-size)")


def window_pool(b: SpecBuilder, page_table, options: CompileOptions, tokens) -> dict:
    """A sliding-window model whose window layers keep their KV in a pool of their own (SGLang's ``SWAKVPool``):
    those layers read the same pages translated into that pool through its ``full_to_swa`` slot table
    (``swa_page_table``: the window pool's page of each page's first slot) and write the step's ``tokens`` write
    slots (the batch's ``out_cache_loc``, so many per step) translated the same way (``swa_out_cache_loc``).
    FA3's kernel applies the window itself, over every page."""
    full_to_swa = b.pool("full_to_swa", I64, ["N"])
    with b.in_graph():
        out_loc = b.input("out_cache_loc", I64, [tokens], fill=0, kind=Kind.slot)
        return translated(b, full_to_swa, page_table, out_loc, options.page_size)


def translated(b: SpecBuilder, full_to_swa, page_table, out_loc, P: int, prefix: str = "") -> dict:
    """``swa_page_table`` and ``swa_out_cache_loc`` (named with ``prefix``): ``page_table``'s pages and the write
    slots ``out_loc`` in the window pool."""
    first = page_table if P == 1 else b.ewise("mul", page_table, P)  # a page's first slot (pages are aligned)
    swa = b.lookup(full_to_swa, first)
    swa = swa if P == 1 else b.ewise("floordiv", swa, P)
    return {f"{prefix}swa_page_table": b.cast(swa, I32, name=f"{prefix}swa_page_table"),
            f"{prefix}swa_out_cache_loc": b.lookup(full_to_swa, out_loc, name=f"{prefix}swa_out_cache_loc")}


SPEC = BackendSpec("flashattention", build, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                   doc="FlashAttention decode: cache_seqlens, cu_seqlens_q/k, page table at static width W",
                   headroom=verify_headroom, windows=True, options_type=FlashAttentionOptions)
TRTLLM_MHA_SPEC = BackendSpec("trtllm_mha", build_trtllm_mha,
                              (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                              doc="TRT-LLM MHA (Hopper, Blackwell): FlashAttention's metadata, draft extend strided "
                                  "by the draft tokens", headroom=verify_headroom)


def build_draft(mode: ForwardMode, options: CompileOptions) -> Graph:
    """Draft decode, S steps of one token each (topk 1): step i attends to the prefix plus the
    i + 1 tokens drafted so far. All steps' metadata is built in one graph before the drafter's
    steps run; page tables keep the static width W with row guards."""
    b = SpecBuilder(f"flashattention_draft.{mode.name.lower()}")
    if options.topk > 1:
        if options.window_pool:
            raise OptionsError("flashattention_draft: a sliding-window pool is not planned for EAGLE's draft decode "
                               "with topk > 1 (its branches' translated pages); serve the draft with SGLang's own fa3 "
                               "drafter (--speculative-draft-attention-backend fa3)")
        return tree_draft(b, options)
    S = options.num_steps
    seq_lens, rpi, req_to_token = decode_inputs(b, S)
    out = {}
    with b.in_graph():
        out["cu_seqlens_q"] = b.arange("bs + 1", name="cu_seqlens_q")
        if options.window_pool:  # every request's S draft slots in a row (EAGLE's [bs, topk, S] layout)
            full_to_swa = b.pool("full_to_swa", I64, ["N"])
            out_loc = b.input("out_cache_loc", I64, [f"{S}*bs"], fill=0, kind=Kind.slot)
        for i in range(S):
            p = step_prefix(i)
            lens = out[p + "cache_seqlens_int32"] = b.ewise("add", seq_lens, i + 1)
            out[p + "cu_seqlens_k"] = b.cumsum(lens)
            out[p + "page_table"] = b.page_table(req_to_token, rpi, lens, page_size=options.page_size, width="W")
            if options.window_pool:  # step i writes each request's i-th draft slot
                mine = b.lookup(out_loc, b.arange("bs", start=i, step=S))
                out |= translated(b, full_to_swa, out[p + "page_table"], mine, options.page_size, p)
    with b.out_graph():
        out["max_seq_len_q"] = b.full(1, [], I32, Placement.host)
    b.outputs(**out)
    return b.build()


DRAFT_SPEC = BackendSpec("flashattention_draft", build_draft, (ForwardMode.DECODE,),
                         doc="FlashAttention draft decode: every step's metadata, S steps (topk > 1: each branch's "
                             "drafts in a second attention)",
                         headroom=lambda mode, options: options.num_steps if options.topk <= 1 else
                         branch_headroom(mode, options), windows=True)
