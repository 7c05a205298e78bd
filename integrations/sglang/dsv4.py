"""DeepSeek-V4's compressor plans and indexer inputs as SGLang's own objects, over a compiled
``dsv4`` backend's metadata (views, no copies: the buffers a captured graph writes).

SGLang's DSV4 attention backend hands its compressors a ``CompressorDecodePlan`` (decode, idle) or
a ``CompressorPrefillPlan`` (target verify) per ratio, and its c4 indexer the page table, the
compressed lengths, the compressed page size and DeepGEMM's SM schedule. ``compress_metadata`` and
``indexer_inputs`` build exactly those from attnmeta's fields. The attention metadata object
itself (``DSV4AttnMetadata``) also carries FlashMLA's scheduler state, which only SGLang's GPU
kernels build; a full DSV4 backend class is not provided.
"""

from __future__ import annotations

import torch

from attnmeta.backends.dsv4 import PAGE
from attnmeta.backends.dsv4_indexer import PAGE as INDEX_PAGE
from attnmeta.compiler.ir.errors import UserError


def compress_metadata(meta, ratio: int):
    """SGLang's plan of the ``ratio`` (4 or 128) compressor for the step ``meta`` describes."""
    from sglang.kernels.ops.attention.dsv4.compress import CompressorDecodePlan, CompressorPrefillPlan

    if ratio not in (4, 128):
        raise UserError(f"DSV4 compresses at ratios 4 and 128, not {ratio}")
    decode = getattr(meta, f"c{ratio}_plan_d", None)
    if decode is not None:
        return CompressorDecodePlan(ratio, decode.view(torch.uint8))
    c, w = getattr(meta, f"c{ratio}_plan_c", None), getattr(meta, f"c{ratio}_plan_w", None)
    if c is None or w is None:
        raise UserError("this step's metadata has no compressor plan: draft extend is SWA only (SGLang runs no "
                        "compressor there); pass the metadata of a decode, idle or target-verify step")
    return CompressorPrefillPlan(ratio, c.view(torch.uint8), w.view(torch.uint8))


def indexer_inputs(meta) -> dict:
    """What SGLang's c4 indexer reads: the page table (pages of 256 tokens, 64 compressed entries),
    each query's compressed length, and DeepGEMM's SM schedule over those lengths."""
    return {"page_table": meta.page_table, "page_size": PAGE, "compressed_page_size": INDEX_PAGE,
            "compressed_seq_lens": meta.c4_topk_lengths_raw, "schedule": meta.c4_indexer_schedule}
