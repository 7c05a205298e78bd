"""SGLang's FlashAttention-3 backend (``fa3``, its default on Hopper for most dense models) with its
captured modes' metadata compiled by attnmeta.

``FA3Backend`` *is* SGLang's ``FlashAttentionBackend`` (a subclass, built by SGLang's own ``__init__``
from the model runner); ``CompiledModes`` routes decode, idle, target verify and draft extend V2 to
the compiled ``flashattention`` spec (one fused kernel per step: key lengths, query and key indptrs,
the page table at its static width) and everything else to SGLang's own code. ``FA3DraftBackend`` is
SGLang's ``FlashAttentionMultiStepBackend`` with every draft step's metadata compiled into one kernel
(``flashattention_draft``; with topk > 1 the prefix's and every step's branches' metadata).

EAGLE with topk > 1 verifies a tree in two attentions merged by their LSE: the prefix (decode's metadata over
the cached keys) and the drafts each query's tree-mask row shows (``forward_metadata_spec_decode_expand``).
The compiled verify reads the tree mask from its ``custom_mask`` field, which SGLang's EAGLE worker writes in
place (the backend's ``verify_mask``), and builds the expansion in the recorded kernel.

Sliding-window models are served: FA3's kernel applies each layer's window itself (``window_size``), over the
same metadata, which is what SGLang builds then too. Where the window layers keep their KV in a pool of their
own (``SWAKVPool``), they read the same pages translated into it (``swa_page_table``) and write the step's
slots translated (``swa_out_cache_loc``), from the same recorded kernel; attnmeta's drafter does not plan that
pool at topk > 1 (the error names SGLang's own fa3 drafter, ``--speculative-draft-attention-backend fa3``).

Under EAGLE topk > 1 the window layers verify in one attention per draft query over its cached keys and the
drafts its tree-mask row shows (``swa_spec_metadata``), built in the same recorded kernel, at page size 1 as
SGLang plans it.

Chunked local attention (Llama 4's iRoPE layers) is served in decode and in EAGLE's target verify at topk 1: each
chunk a request's queries fall in is a batch item of its own (``local_attn_metadata``; a verify's drafts may run
into a second chunk), from the same recorded kernel. SGLang's own fa3 builds the verify's chunks in eager steps
only; its captured verify has none, so there its chunked layers attend the whole prefix.

What it does not serve yet is refused at start with the reason (``unserved``): windows under EAGLE topk > 1 at
page sizes past 1, prefill-aware windows, chunked local attention under EAGLE topk > 1, MLA on FA3, the FA4
kernels, a translated (unified) KV pool, a sharded KV pool, encoder-decoder models.

FA3's precomputed split schedule (``scheduler_metadata``) is left unset, which FA3's kernel takes as
"schedule inside the kernel": SGLang computes it once at capture, from the capture batch, and reuses it
on every replay of that graph.
"""

from __future__ import annotations

from attnmeta.backends.flashattention.spec import FlashAttentionOptions
from attnmeta.compiler.ir.errors import OptionsError

from .backend import mask_in_place, mask_into_plan, own_verify_mask
from .draft import _Drafter, _step
from .kinds import sglang
from .options import rank_heads, resolved_options, sliding_window
from .served import CompiledModes

_SGLangFA3, _SGLangFA3Draft = sglang("sglang.srt.layers.attention.flashattention_backend", "FlashAttentionBackend",
                                     "FlashAttentionMultiStepBackend",
                                     needs="SGLang and its kernel package sgl_kernel (FlashAttention-3's kernels)",
                                     install="pip install 'attnmeta[sglang]' sgl-kernel")


def _metadata(lens, cu_q, cu_k, table, max_q: int, max_k: int):
    """SGLang's ``FlashAttentionMetadata`` over compiled buffers: key lengths, both indptrs, the page table, the
    longest query and key."""
    from sglang.srt.layers.attention.flashattention_backend import FlashAttentionMetadata

    return FlashAttentionMetadata(cache_seqlens_int32=lens, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, page_table=table,
                                  max_seq_len_q=int(max_q), max_seq_len_k=int(max_k))


class FA3Backend(CompiledModes, _SGLangFA3):
    """SGLang's FlashAttention-3 backend; its decode, idle, target verify (any topk) and draft extend V2
    metadata compiled into recorded kernels instead of SGLang's per-step rebuild on the host and device."""

    spec_name, sglang_name = "flashattention", "fa3"

    def __init__(self, model_runner, skip_prefill: bool = False, speculative_step_id: int = 0, topk: int = 0,
                 speculative_num_steps: int = 0, fa_impl_ver: int = 3, *, compiled=None):
        super().__init__(model_runner, skip_prefill, speculative_step_id, topk, speculative_num_steps, fa_impl_ver)
        q, kv = rank_heads(model_runner)
        window, pools = sliding_window(self)
        # chunked local attention (Llama 4's iRoPE layers): SGLang's model config says so, its runner has the chunk
        chunk = model_runner.attention_chunk_size if self.local_attn_builder is not None else 0
        own = {"backend": FlashAttentionOptions(attention_chunk=chunk)} if chunk else {}
        wanted = resolved_options(model_runner, self, num_heads=q, num_kv_heads=kv, **window, **own)
        self._attach(compiled, wanted, self.req_to_token, model_runner.device, **pools)

    def unserved(self) -> list[str]:
        import sglang.srt.layers.attention.flashattention_backend as fa

        major = (fa.get_device_capability() or (None,))[0] or 0  # no GPU: (None, None)
        gpu = f"a GPU of compute capability {major}.x" if major else "a machine without a CUDA GPU"
        checks = ((major not in (8, 9), f"{gpu} (FlashAttention-3 runs on compute capability 8.x and 9.x, as SGLang's "
                                        "own fa3 requires; attnmeta_flashinfer and attnmeta_triton run elsewhere)"),
                  # a window is FA3's kernel's own (window_size per layer, over the same metadata; a window pool's
                  # layers read the pages translated); topk > 1's window merges the tree per query
                  (self.use_sliding_window_kv_pool and self.token_to_kv_pool.full_to_swa_index_mapping is None,
                   "a sliding-window pool without its full-to-window slot table"),
                  (self.has_swa and self._tree() and self.page_size > 1,
                   "sliding-window attention under EAGLE topk > 1 at page size > 1 (SGLang's own fa3 plans its merged "
                   "window at page size 1 only)"),
                  (getattr(self, "is_prefill_aware_swa", False), "prefill-aware sliding-window attention"),
                  (self.local_attn_builder is not None and (self.topk > 1 or self.is_draft_runner),
                   "chunked local attention under EAGLE topk > 1 or in a draft model (SGLang's own fa3 plans no "
                   "chunk for a tree verify or a draft step; topk 1 is served)"),
                  (self.use_mla, "MLA models on FlashAttention"),
                  (self.fa_impl_ver != 3, f"FlashAttention {self.fa_impl_ver} (attnmeta_fa3 serves FA3's)"),
                  (self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self._kv_shard_pool is not None, "a sharded KV pool"),
                  (self.is_encoder_decoder, "encoder-decoder models"))
        return [name for bad, name in checks if bad]

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        if self._tree():  # the worker writes the tree mask where the compiled verify reads it
            self._verify_mask = own_verify_mask(self)

    def _tree(self) -> bool:
        return self.topk > 1 and not self.is_draft_runner

    def _replay_requires(self, v):
        return mask_in_place(v, self.verify_mask) if self._tree() else ()

    def _before_staging(self, v, in_capture: bool) -> None:
        if self._tree():
            mask_into_plan(self, v, in_capture)

    def _shape(self, m, v):
        meta = _metadata(m.cache_seqlens_int32, m.cu_seqlens_q, m.cu_seqlens_k, m.page_table, m.max_seq_len_q,
                         m.max_seq_len_k)
        if hasattr(m, "local_seqused_k"):  # chunked local attention: each request's current chunk a batch item
            from sglang.srt.layers.attention.local_attention import LocalAttentionMetadata

            chunk = self.attnmeta.compiled.options.of(FlashAttentionOptions).attention_chunk
            # the longest item's queries: a bound (verify's D queries may split between two chunks), as FA3 needs
            meta.local_attn_metadata = LocalAttentionMetadata(
                local_query_start_loc=m.local_query_start_loc, local_seqused_k=m.local_seqused_k,
                local_block_table=m.local_block_table, local_max_query_len=min(int(m.max_seq_len_q), chunk),
                local_max_seq_len=chunk)
        if self.attnmeta.compiled.options.window_pool:  # the window layers' pages and write slots, in their pool
            meta.swa_page_table = getattr(m, "swa_page_table", None)  # a tree verify's are its window attention's
            meta.swa_out_cache_loc = m.swa_out_cache_loc
        if not hasattr(m, "expand_page_table"):
            return meta, None
        if hasattr(m, "swa_spec_page_table"):  # the window layers: one sequence per draft query, keys then drafts
            meta.swa_spec_metadata = _metadata(m.swa_spec_cache_seqlens_int32, m.expand_cu_seqlens_q,
                                               m.swa_spec_cu_seqlens_k, m.swa_spec_page_table, 1, m.max_seq_len_k)
        # the drafts' attention: one query per row over the drafts its tree-mask row shows
        return meta, _metadata(m.expand_cache_seqlens_int32, m.expand_cu_seqlens_q, m.expand_cu_seqlens_k,
                               m.expand_page_table, 1, m.max_seq_len_k)

    def _publish(self, shaped) -> None:
        self.forward_metadata, self.forward_metadata_spec_decode_expand = shaped


class FA3DraftBackend(_Drafter, _SGLangFA3Draft):
    """SGLang's FlashAttention-3 multi-step drafter; every step's key lengths, key indptr and page table from
    ``flashattention_draft`` in one recorded kernel, where SGLang rebuilds each step's on the host and device
    every round. With topk > 1 each step is FA3's two attentions: the prefix, the same for every step, and the
    step's branches (``forward_metadata_spec_decode_expand``: each branch's drafted tokens so far, by page, from
    the branch's region of the request table, where EAGLE's worker writes the slots ``out_cache_loc`` holds).
    Each step's attention is its own SGLang child backend's."""

    spec_name = "flashattention_draft"

    def __init__(self, model_runner, topk: int, speculative_num_steps: int, fa_impl_ver: int = 3, *, compiled=None):
        super().__init__(model_runner, topk, speculative_num_steps, fa_impl_ver)
        pool = any(c.use_sliding_window_kv_pool for c in self.attn_backends)
        if pool and topk > 1:
            raise OptionsError("attnmeta's flashattention_draft does not plan a sliding-window pool's draft steps with "
                               "topk > 1 (its branches' translated pages); serve this draft with SGLang's own fa3 "
                               "drafter (--speculative-draft-attention-backend fa3); attnmeta_fa3 still serves the "
                               "target's decode and verify and the draft extend")
        q, kv = rank_heads(model_runner)
        window, pools = sliding_window(self.attn_backends[0]) if self.attn_backends else ({}, {})
        wanted = resolved_options(model_runner, self.attn_backends[0], modes=("decode", "idle"), topk=max(topk, 1),
                                  num_steps=speculative_num_steps, num_heads=q, num_kv_heads=kv, **window)
        self._attach(compiled, wanted, model_runner.req_to_token_pool.req_to_token, model_runner.device, **pools)

    def _step_shape(self, m, s: int):
        L = self.attnmeta.compiled.options.max_context_len
        if self.topk <= 1:
            meta = _metadata(_step(m, s, "cache_seqlens_int32"), m.cu_seqlens_q, _step(m, s, "cu_seqlens_k"),
                             _step(m, s, "page_table"), m.max_seq_len_q, L)
            if self.attnmeta.compiled.options.window_pool:  # the step's pages and its draft's write slots, translated
                meta.swa_page_table, meta.swa_out_cache_loc = _step(m, s, "swa_page_table"), \
                    _step(m, s, "swa_out_cache_loc")
            return meta, None
        prefix = _metadata(m.cache_seqlens_int32, m.cu_seqlens_q, m.cu_seqlens_k, m.page_table, m.max_seq_len_q, L)
        return prefix, _metadata(_step(m, s, "expand_cache_seqlens_int32"), m.expand_cu_seqlens_q,
                                 _step(m, s, "expand_cu_seqlens_k"), _step(m, s, "expand_page_table"), 1, L)

    def _publish(self, shaped) -> None:
        for child, (meta, expand) in zip(self.attn_backends, shaped, strict=True):
            child.forward_metadata, child.forward_metadata_spec_decode_expand = meta, expand
