"""A vLLM attention-metadata builder whose metadata attnmeta compiles.

``AttnmetaPagedMetadataBuilder`` subclasses vLLM's ``AttentionMetadataBuilder`` (vLLM 0.33,
``vllm.v1.attention.backend``). From vLLM's ``CommonAttentionMetadata`` (``seq_lens``,
``block_table_tensor``, ``query_start_loc``, ``slot_mapping``) it builds the paged-KV layout a
FlashInfer-style kernel reads (``paged_kv_indptr``, ``paged_kv_indices``,
``paged_kv_last_page_len``) in static buffers, with one recorded kernel, where vLLM's own builder
computes them on the host with NumPy and copies them over every step.

vLLM's persistent block table is bound once as the spec's pool (row i is request i of the batch).
Lengths are staged and checked from the host: vLLM's ``seq_lens_cpu_upper_bound`` is exact outside
asynchronous speculative decoding, and a batch without it is refused rather than read from the
device (a sync per step).
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import BatchError, StaleBufferError

from .spec import SPEC

try:
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder
except ImportError as e:
    raise ImportError(f"attnmeta.integrations.vllm needs vLLM ({e}); pip install vllm") from e


@attrs.frozen
class AttnmetaPagedMetadata:
    """vLLM's common fields, passed through, and the paged-KV layout attnmeta builds."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    paged_kv_indptr_cpu: torch.Tensor  # host copies, for a planner (FlashInfer's plan())
    paged_kv_last_page_len_cpu: torch.Tensor
    causal: Any = True


class _Batch:
    __slots__ = ("batch_size", "forward_mode", "seq_lens", "seq_lens_cpu")

    @property
    def actual_forward_mode(self):
        return self.forward_mode

    @property
    def raw_batch_size(self):
        return self.batch_size


def options_from_vllm(vllm_config, kv_cache_spec, **overrides) -> CompileOptions:
    """max_bs from ``scheduler_config.max_num_seqs``, the captured sizes from
    ``compilation_config.cudagraph_capture_sizes``, the page size from the KV cache spec, the context
    from ``model_config.max_model_len``."""
    max_bs = vllm_config.scheduler_config.max_num_seqs
    sizes = [s for s in (getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None) or ())
             if s <= max_bs]
    opts = dict(max_bs=max_bs, capture_sizes=tuple(sizes), page_size=kv_cache_spec.block_size,
                max_context_len=vllm_config.model_config.max_model_len)
    opts.update(overrides)
    return CompileOptions(**opts)


class AttnmetaPagedMetadataBuilder(AttentionMetadataBuilder[AttnmetaPagedMetadata]):
    # The metadata does not depend on query lengths, but the attention kernel that reads it decides
    # what a captured graph can replay: decode batches of one token per request are what a paged
    # decode kernel replays, so that is the level declared.
    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device, compiled=None):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.compiled = compiled or compile_backend(SPEC, options_from_vllm(vllm_config, kv_cache_spec))
        if self.compiled.spec.name != SPEC.name:
            raise OptionsError(f"the vLLM builder serves attnmeta's {SPEC.name!r} spec, "
                               f"got {self.compiled.spec.name!r}")
        self.backend, self._table_ptr = None, None
        self._view = _Batch()
        self._capturing = False

    def _bind(self, table: torch.Tensor):
        """vLLM's persistent block table (max_num_seqs rows) behind the batch's [:num_reqs] view; a step
        whose view starts where the bound table does binds nothing."""
        if self.backend is not None and table.data_ptr() == self._table_ptr:
            return
        o = self.compiled.options
        width = -(-o.max_context_len // o.page_size)  # the spec's W: ceil(L / P) pages
        if table.dim() != 2 or table.shape[1] < width:
            raise BatchError(f"vLLM's block table is {tuple(table.shape)}; a row must hold at least ceil(max_model_len "
                             f"/ block_size) = {width} pages (vLLM pads it wider, which is read as is)")
        if table.stride(1) != 1:
            raise BatchError(f"vLLM's block table has column stride {table.stride(1)}; attnmeta's kernels read rows of "
                             "consecutive pages (pass the table itself, not a transposed view)")
        room = (table.untyped_storage().nbytes() // table.element_size() - table.storage_offset()) // table.stride(0)
        if room < o.max_bs:
            raise BatchError(f"vLLM's block table has room for {room} rows, fewer than max_num_seqs = {o.max_bs} the "
                             "builder was compiled for; pass vLLM's persistent block table (one row per sequence "
                             "slot) or compile with max_bs <= its rows")
        # the first W columns of each row, at vLLM's row stride: its padding columns are never read
        full = torch.as_strided(table, (o.max_bs, width), table.stride())
        if self.backend is None:
            self.backend = self.compiled.instantiate(full, device=table.device, pools={"block_table": full})
        else:
            try:
                self.backend.rebind_pools(block_table=full)
            except StaleBufferError as e:
                raise StaleBufferError(f"vLLM's block table moved after capture: {e}") from None
        self._table_ptr = table.data_ptr()  # only once bound: a refused table is refused again next step

    def build(self, common_prefix_len: int, common_attn_metadata, fast_build: bool = False) -> AttnmetaPagedMetadata:
        cm = common_attn_metadata
        host = cm.seq_lens_cpu_upper_bound
        if host is None:
            raise BatchError("the batch has no seq_lens_cpu_upper_bound: attnmeta stages and checks lengths from the "
                             "host (reading the device copy would sync every step); vLLM sets it except under "
                             "asynchronous speculative decoding")
        self._bind(cm.block_table_tensor)
        v = self._view
        v.batch_size, v.forward_mode, v.seq_lens, v.seq_lens_cpu = cm.num_reqs, ForwardMode.DECODE, cm.seq_lens, host
        self.backend.init_forward_metadata_out_graph(v, in_capture=self._capturing)
        self.backend.init_forward_metadata_in_graph(v)
        m = self.backend.forward_metadata
        return AttnmetaPagedMetadata(
            num_actual_tokens=cm.num_actual_tokens, max_query_len=cm.max_query_len, query_start_loc=cm.query_start_loc,
            max_seq_len=cm.max_seq_len, seq_lens=cm.seq_lens, block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping, paged_kv_indptr=m.paged_kv_indptr, paged_kv_indices=m.paged_kv_indices,
            paged_kv_last_page_len=m.paged_kv_last_page_len, paged_kv_indptr_cpu=m.paged_kv_indptr_cpu,
            paged_kv_last_page_len_cpu=m.paged_kv_last_page_len_cpu, causal=cm.causal)

    def build_for_cudagraph_capture(self, common_attn_metadata) -> AttnmetaPagedMetadata:
        """As ``build``, on a capture batch (which may read row 0 and carry dummy lengths)."""
        self._capturing = True
        try:
            return self.build(0, common_attn_metadata)
        finally:
            self._capturing = False
