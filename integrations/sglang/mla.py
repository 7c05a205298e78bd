"""SGLang's FlashInfer MLA backend (DeepSeek-V2/V3/R1, Kimi) with its captured modes' metadata
compiled: ``attnmeta_flashinfer`` on an MLA model, as SGLang's ``flashinfer`` picks its MLA class.

``FlashInferMLABackend`` *is* SGLang's ``FlashInferMLAAttnBackend`` (built by its ``__init__`` from
the model runner); decode, idle, target verify and draft extend V2 come from attnmeta's
``flashinfer_mla`` spec, planned by ``FlashInferMLAAdapter`` into graph-mode MLA wrappers bound to
the compiled buffers and sharing SGLang's workspace; prefill and everything else stay SGLang's code.
``forward_metadata`` is SGLang's own ``DecodeMetadata`` / ``PrefillMetadata`` of those wrappers,
so its ``forward_decode``/``forward_extend`` run them.
"""

from __future__ import annotations

from .kinds import sglang
from .options import resolved_options
from .served import CompiledModes

_SGLangMLA = sglang("sglang.srt.layers.attention.flashinfer_mla_backend", "FlashInferMLAAttnBackend")


class FlashInferMLABackend(CompiledModes, _SGLangMLA):
    spec_name, sglang_name = "flashinfer_mla", "flashinfer"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, q_indptr_decode_buf=None,
                 *, compiled=None, partition: str = "device"):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, q_indptr_decode_buf)
        from sglang.srt.runtime_context import get_parallel

        from attnmeta.backends.flashinfer_mla.planner import FlashInferMLAAdapter

        mc, par = model_runner.model_config, get_parallel()
        self.num_local_heads = mc.num_attention_heads // par.attn_tp_size
        self._dcp = getattr(par, "dcp_enabled", False)
        wanted = resolved_options(model_runner, self, num_heads=self.num_local_heads, num_kv_heads=1)
        self._attach(compiled, wanted, self.req_to_token_pool.req_to_token, model_runner.device)
        self.adapter = FlashInferMLAAdapter(self.attnmeta, self.num_local_heads, mc.kv_lora_rank,
                                            mc.qk_rope_head_dim, sm_scale=mc.scaling, q_dtype=model_runner.dtype,
                                            kv_dtype=model_runner.dtype, workspace=self.workspace_buffer,
                                            partition=partition)

    def unserved(self) -> list[str]:
        checks = ((self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self._dcp, "decode context parallelism"))
        return [name for bad, name in checks if bad]

    def _shape(self, m, v):
        from sglang.srt.layers.attention.flashinfer_mla_backend import DecodeMetadata, PrefillMetadata

        if v.forward_mode.is_decode_or_idle():
            return DecodeMetadata(m.plan)
        return PrefillMetadata(m.plan, False)
