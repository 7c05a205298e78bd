"""SGLang's TRT-LLM backends (Blackwell's defaults: ``trtllm_mha`` for multi-head attention models,
``trtllm_mla`` for DeepSeek and Kimi) and its CuTe-DSL MLA backend, with their captured modes'
metadata compiled: ``attnmeta_trtllm_mha``, ``attnmeta_trtllm_mla``, ``attnmeta_cutedsl_mla``.

Each class *is* SGLang's backend of that kind (its ``__init__`` builds it from the model runner), so
the trtllm-gen / XQA / CuTe-DSL kernels, KV stores, prefill and everything attnmeta does not compile
stay SGLang's code. Decode, idle, target verify and draft extend V2 come from attnmeta's spec of the
same name; ``_shape`` wraps the compiled buffers in SGLang's own metadata class of the kind
(``TRTLLMMHAMetadata``; TRT-LLM MLA's ``TRTLLMMLADecodeMetadata``, which its kernels read from
``forward_decode_metadata``). None of these kinds has a planner: the kernels read the page table and
the key lengths the recorded graph writes.
"""

from __future__ import annotations

from .kinds import sglang
from .options import rank_heads, resolved_options
from .served import CompiledModes

_SGLangCuteDSL = sglang("sglang.srt.layers.attention.cutedsl_mla_backend", "CuteDslMLABackend")
_SGLangTRTLLMMHA = sglang("sglang.srt.layers.attention.trtllm_mha_backend", "TRTLLMHAAttnBackend")
_SGLangTRTLLMMLA = sglang("sglang.srt.layers.attention.trtllm_mla_backend", "TRTLLMMLABackend")


class TRTLLMMHABackend(CompiledModes, _SGLangTRTLLMMHA):
    spec_name, sglang_name = "trtllm_mha", "trtllm_mha"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, kv_last_page_len_buf=None,
                 speculative_step_id: int = 0, *, compiled=None):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, kv_last_page_len_buf, speculative_step_id)
        q, kv = rank_heads(model_runner)
        wanted = resolved_options(model_runner, self, num_heads=q, num_kv_heads=kv)
        self._attach(compiled, wanted, self.req_to_token, model_runner.device)

    def unserved(self) -> list[str]:
        checks = ((self.use_sliding_window_kv_pool, "a sliding-window KV pool (its SWA page table)"),
                  (self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self.expand_encoder_only_verify, "encoder-only (bidirectional) verify layers"),
                  (self.topk > 1, "EAGLE with topk > 1"))
        return [name for bad, name in checks if bad]

    def _shape(self, m, v):
        from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMMHAMetadata

        return TRTLLMMHAMetadata(cache_seqlens_int32=m.cache_seqlens_int32, max_seq_len_q=int(m.max_seq_len_q),
                                 cu_seqlens_q=m.cu_seqlens_q, cu_seqlens_k=m.cu_seqlens_k, page_table=m.page_table)


class TRTLLMMLABackend(CompiledModes, _SGLangTRTLLMMLA):
    spec_name, sglang_name = "trtllm_mla", "trtllm_mla"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, q_indptr_decode_buf=None,
                 *args, compiled=None, **kw):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, q_indptr_decode_buf, *args, **kw)
        from sglang.srt.runtime_context import get_parallel

        self._dcp = getattr(get_parallel(), "dcp_enabled", False)
        wanted = resolved_options(model_runner, self, num_heads=self.num_q_heads, num_kv_heads=1)
        self._attach(compiled, wanted, self.req_to_token, model_runner.device)

    def unserved(self) -> list[str]:
        checks = ((self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self._dcp, "decode context parallelism"),
                  (self._kv_shard_pool is not None, "a sharded KV pool"))
        return [name for bad, name in checks if bad]

    def _shape(self, m, v):
        from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLADecodeMetadata

        bs = v.batch_size
        md = TRTLLMMLADecodeMetadata(block_kv_indices=m.block_kv_indices, max_seq_len_k=self.max_context_len,
                                     seq_lens_k=m.seq_lens_k)
        if v.forward_mode.is_target_verify():
            md.global_seq_lens_k = m.seq_lens_k  # without context parallelism the global lengths are the local
        if v.forward_mode.is_draft_extend():
            D = self.num_draft_tokens
            md.max_seq_len_q, md.sum_seq_lens_q = D, D * bs
            md.cu_seqlens_q, md.seq_lens_q = m.cu_seqlens_q, m.seq_lens_q
        return md

    def _publish(self, shaped) -> None:
        self.forward_decode_metadata = shaped  # what SGLang's TRT-LLM MLA kernels read in graph mode


class CuteDSLMLABackend(TRTLLMMLABackend, _SGLangCuteDSL):
    """CuTe-DSL MLA: SGLang's class is TRT-LLM MLA's with another kernel call; the metadata is the same."""

    spec_name, sglang_name = "cutedsl_mla", "cutedsl_mla"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, q_indptr_decode_buf=None,
                 *, compiled=None):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, q_indptr_decode_buf, compiled=compiled)


__all__ = ["CuteDSLMLABackend", "TRTLLMMHABackend", "TRTLLMMLABackend"]
