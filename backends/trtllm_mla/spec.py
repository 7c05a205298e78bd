"""TRT-LLM MLA metadata (SGLang's ``trtllm_mla``, Blackwell's default for DeepSeek and Kimi), declared
once; SGLang's CuTe-DSL MLA backend (``cutedsl_mla``) prepares the same metadata with the same code
(it subclasses TRT-LLM's and overrides only the kernel call), so ``CUTEDSL_SPEC`` is this spec
under its name. No planner: the trtllm-gen kernels read a page table (``block_kv_indices``: page ids, as
SGLang's ``create_flashmla_kv_indices_triton`` writes them from the request table) and int32 key
lengths (``seq_lens_k``); the longest key length they are told is the context length, a constant.

The table's width is SGLang's: the pages of the context, padded to a multiple of both TRT-LLM's
constraint (128 tokens of pages) and SGLang's index kernel's block (4096 tokens of pages), so a
captured graph covers any length up to the context. Target verify reads the prefix and the D
drafts; draft extend (V2) T = D query slots per request (``cu_seqlens_q``, ``seq_lens_q``) over
the whole sequence. Only the pages a row's length covers are written; kernels read no further.
"""

from __future__ import annotations

import math

import attrs

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, SpecBuilder

from ..common import decode_inputs, verify_headroom

I32 = DType.int32
TRTLLM_BLOCK_TOKENS = 128  # TRT-LLM: a row's page count is a multiple of 128 / page size
INDEX_BLOCK_TOKENS = 4096  # SGLang's index kernel writes the table in blocks of this many tokens of pages


def padded_pages(context: int, page_size: int) -> int:
    """The table's width: the context's pages, padded to both constraints' common multiple."""
    pages = -(-context // page_size)
    step = math.lcm(TRTLLM_BLOCK_TOKENS // page_size, INDEX_BLOCK_TOKENS // page_size)
    return -(-pages // step) * step


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"trtllm_mla.{mode.name.lower()}")
    seq_lens, rpi, req_to_token = decode_inputs(b, verify_headroom(mode, options))
    D, P = options.num_draft_tokens, options.page_size
    fields = {}
    with b.in_graph():
        keys = b.ewise("add", seq_lens, D, name="seq_lens_k") if mode.is_target_verify() else seq_lens
        fields["block_kv_indices"] = b.page_table(req_to_token, rpi, keys, page_size=P,
                                                  width=padded_pages(options.max_context_len, P),
                                                  name="block_kv_indices")
        if mode.is_draft_extend():
            fields["cu_seqlens_q"] = b.arange("bs + 1", step=D, name="cu_seqlens_q")
            fields["seq_lens_q"] = b.full(D, ["bs"], I32, name="seq_lens_q")
    b.outputs(seq_lens_k=keys, **fields)
    return b.build()


SPEC = BackendSpec("trtllm_mla", build, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                   doc="TRT-LLM MLA (Blackwell): page table of page ids at a padded static width, int32 key lengths",
                   headroom=verify_headroom, page_sizes=(32, 64))
CUTEDSL_SPEC = attrs.evolve(SPEC, name="cutedsl_mla",
                            doc="CuTe-DSL MLA (Blackwell): TRT-LLM MLA's page table and key lengths, the same code")
