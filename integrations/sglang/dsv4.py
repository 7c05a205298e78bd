"""DeepSeek-V4's compressor plans and indexer inputs as SGLang's own objects, over a compiled
``dsv4`` backend's metadata (views, no copies: the buffers a captured graph writes).

SGLang's DSV4 attention backend hands its compressors a ``CompressorDecodePlan`` (decode, idle) or
a ``CompressorPrefillPlan`` (target verify) per ratio, and its c4 indexer the page table, the
compressed lengths, the compressed page size and DeepGEMM's SM schedule. ``compress_metadata`` and
``indexer_inputs`` build exactly those from attnmeta's fields. ``forward_metadata`` builds the whole
object SGLang's DSV4 attention reads per step (``DSV4Metadata``: the core ``DSV4AttnMetadata``, the
c4 indexer's ``PagedIndexerMetadata`` and both compressor plans) over those same buffers; the GPU
schedulers inside it (FlashMLA's and DeepGEMM's) are SGLang's own, created by SGLang's constructors
as its backend creates them. ``DSV4Backend`` (``dsv4_backend.py``) serves it to SGLang.
"""

from __future__ import annotations

import torch

from attnmeta.backends.dsv4.indexer import PAGE as INDEX_PAGE
from attnmeta.backends.dsv4.spec import PAGE
from attnmeta.compiler.ir.errors import UserError
from attnmeta.compiler.modes import ForwardMode
from attnmeta.runtime.metadata import ratio_prefix

RATIOS = (4, 128)  # DeepSeek-V4's compression ratios, the ones the dsv4 spec plans


def compress_metadata(meta, ratio: int):
    """SGLang's plan of the ``ratio`` (4 or 128) compressor for the step ``meta`` describes."""
    from sglang.kernels.ops.attention.dsv4.compress import CompressorDecodePlan, CompressorPrefillPlan

    if ratio not in (4, 128):
        raise UserError(f"DSV4 compresses at ratios 4 and 128, not {ratio}")
    decode = getattr(meta, ratio_prefix(ratio) + "plan_d", None)
    if decode is not None:
        return CompressorDecodePlan(ratio, decode.view(torch.uint8))
    c, w = getattr(meta, ratio_prefix(ratio) + "plan_c", None), getattr(meta, ratio_prefix(ratio) + "plan_w", None)
    if c is None or w is None:
        raise UserError("this step's metadata has no compressor plan: draft extend is SWA only (SGLang runs no "
                        "compressor there); pass the metadata of a decode, idle or target-verify step")
    return CompressorPrefillPlan(ratio, c.view(torch.uint8), w.view(torch.uint8))


def indexer_inputs(meta) -> dict:
    """What SGLang's c4 indexer reads: the page table (pages of 256 tokens, 64 compressed entries),
    each query's compressed length, and DeepGEMM's SM schedule over those lengths."""
    return {"page_table": meta.page_table, "page_size": PAGE, "compressed_page_size": INDEX_PAGE,
            "compressed_seq_lens": meta.c4_topk_lengths_raw, "schedule": meta.c4_indexer_schedule}


def forward_metadata(meta, mode: ForwardMode, *, index_topk: int, ratios: tuple[int, ...] = RATIOS,
                     use_topk_v2: bool = False):
    """SGLang's ``DSV4Metadata`` for one step of ``mode``, over the compiled backend's metadata ``meta``.

    Every tensor is a view of a compiled buffer (a captured graph writes them; nothing is copied).
    The fields and their widths are those SGLang's ``make_core_attn_metadata`` produces: decode,
    idle and target verify with the compression fields of each of ``ratios`` (the pool's, as the
    backend was compiled: ``compress_ratios``), the c4 sparse buffers and the indexer with c4, and
    the compressor plans; draft extend SWA only, with SGLang's one-page placeholder page table and no
    indexer. Fields of a ratio the pool lacks are None, as SGLang leaves them. The scheduler objects
    (``c*_flashmla_metadata``, the indexer's DeepGEMM schedule and top-k plan) come from SGLang's own
    constructors: on a GPU they are computed where this is called, so call it where SGLang builds its
    metadata (inside the captured region, for a graph).
    """
    import sglang.srt.layers.attention.deepseek_v4_backend as sgl
    from sglang.srt.layers.attention.dsv4.metadata import PagedIndexerMetadata

    swa_only = mode.is_draft_extend()
    table = meta.page_table[:, :1] if swa_only else meta.page_table
    core = sgl.DSV4AttnMetadata(
        page_size=PAGE, page_table=table, raw_out_loc=meta.raw_out_loc,
        cuda_int32_kwargs={"device": meta.page_table.device, "dtype": torch.int32},
        seq_lens_casual=meta.seq_lens_casual, positions_casual=meta.positions,
        swa_page_indices=meta.swa_page_indices, swa_topk_lengths=meta.swa_topk_lengths, index_topk=index_topk,
        present_ratios=tuple(ratios), swa_out_cache_loc=meta.swa_out_cache_loc)
    core.c0_flashmla_metadata = sgl._create_flashmla_metadata()
    core.c4_sparse_topk_lengths = core.c4_sparse_page_indices = None
    core.c4_flashmla_metadata = core.c128_flashmla_metadata = None
    if swa_only:  # SGLang's need_compress=False: no compressed fields, no c4/c128 schedulers
        return sgl.DSV4Metadata(core_attn_metadata=core, indexer_metadata=None)
    for r in ratios:
        for name in _FIELDS[r]:
            setattr(core, name, getattr(meta, name))
        setattr(core, ratio_prefix(r) + "flashmla_metadata", sgl._create_flashmla_metadata())
    indexer = None
    if 4 in ratios:
        indexer = PagedIndexerMetadata(page_size=PAGE, compressed_page_size=INDEX_PAGE, page_table=meta.page_table,
                                       compressed_seq_lens=meta.c4_topk_lengths_raw, use_topk_v2=use_topk_v2)
    plans = {ratio_prefix(r) + "compress_metadata": compress_metadata(meta, r) for r in ratios}
    return sgl.DSV4Metadata(core, indexer, **plans)


_FIELDS = {4: ("c4_out_loc", "c4_topk_lengths_raw", "c4_topk_lengths_clamp1", "c4_sparse_topk_lengths",
               "c4_sparse_page_indices"),
           128: ("c128_out_loc", "c128_page_indices", "c128_topk_lengths_clamp1")}
