"""FlashAttention metadata (decode), declared once; TRT-LLM MHA's is the same but for draft extend.

The page table has a static width W = ceil(L / P) and guards each row on
device (pages past ceil(seq_len / P) are 0), so no host maximum is baked
into the captured graph. ``max_seq_len_q`` is the per-mode constant 1 and
``max_seq_len_k`` the static bound L: constants, not per-step host numbers.
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
    chunk = options.of(FlashAttentionOptions).attention_chunk if name == "flashattention" else 0
    if chunk:
        win |= local_chunks(b, seq_lens, win.get("swa_page_table", page_table), mode, options, chunk)
    with b.out_graph():
        max_q = b.full(T, [], I32, Placement.host, name="max_seq_len_q")
        max_k = b.full(options.max_context_len, [], I32, Placement.host, name="max_seq_len_k")
    b.outputs(cache_seqlens_int32=cache_seqlens, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
              page_table=page_table, max_seq_len_q=max_q, max_seq_len_k=max_k, **win)
    return b.build()


def local_chunks(b: SpecBuilder, seq_lens, table, mode: ForwardMode, options: CompileOptions, C: int) -> dict:
    """Chunked local attention, decode (SGLang's ``LocalAttentionMetadataBuilder``, one query per request): each
    request's current chunk of ``C`` tokens is one batch item (``local_query_start_loc``), its keys the tokens of
    that chunk so far, ((seq - 1) mod C) + 1 (``local_seqused_k``), its pages those of the chunk's columns of
    ``table`` (the window pool's where the chunked layers keep their KV there), C / P of them, the columns past the
    table's last clamped to it as SGLang clamps them (the kernel reads only the first ceil(keys / P))."""
    P = options.page_size
    if not mode.is_decode():
        raise OptionsError(f"flashattention: chunked local attention is planned for decode only, not "
                           f"{mode.name.lower()} (SGLang's own fa3 captures it for decode only); serve EAGLE on a "
                           f"chunked-attention model with SGLang's own fa3")
    if C % P:
        raise OptionsError(f"attention_chunk={C} is not a multiple of the page size {P}: a chunk must start on a page "
                           f"(--attention-chunk, --page-size)")
    last = math.ceil(options.max_context_len / P) - 1
    with b.in_graph():
        keys = b.ewise("add", b.ewise("mod", b.ewise("sub", seq_lens, 1), C), 1, name="local_seqused_k")
        first = b.ewise("floordiv", b.ewise("sub", seq_lens, keys), P)  # the chunk's first page column
        cols = b.clamp(b.outer("add", first, b.arange(C // P)), 0, last)
        return {"local_query_start_loc": b.arange("bs + 1", name="local_query_start_loc"), "local_seqused_k": keys,
                "local_block_table": b.gather_rows(table, b.arange("bs"), cols, name="local_block_table")}


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
