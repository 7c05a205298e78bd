"""SGLang's FlashMLA backend (Hopper's MLA decode kernel: DeepSeek-V2/V3/R1, Kimi) with its captured
modes' metadata compiled: ``attnmeta_flashmla``.

``FlashMLABackend`` *is* SGLang's ``FlashMLABackend`` (built by its ``__init__`` from the model
runner), so FlashMLA's kernels, the KV stores, prefill (SGLang's FlashInfer MLA path) and the verify
mask stay SGLang's code. Decode, idle, target verify and draft extend V2 come from attnmeta's
``flashmla`` spec: the 64-token page table, the key lengths and FlashMLA's tile schedule, the last
computed on the GPU by a kernel recorded with the metadata (``backends/flashmla/planner.py``), where SGLang
calls FlashMLA's ``get_mla_metadata`` and copies its result into its graph buffers every step.
``forward_metadata`` is SGLang's own ``FlashMLADecodeMetadata`` over the compiled buffers.
"""

from __future__ import annotations

from .kinds import sglang
from .options import device_sms, resolved_options
from .served import CompiledModes

_SGLangFlashMLA = sglang("sglang.srt.layers.attention.flashmla_backend", "FlashMLABackend", needs="SGLang and FlashMLA",
                         install="pip install 'attnmeta[sglang]' sgl-flash-mla")


class FlashMLABackend(CompiledModes, _SGLangFlashMLA):
    spec_name, sglang_name = "flashmla", "flashmla"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, kv_last_page_len_buf=None,
                 *, compiled=None):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, kv_last_page_len_buf)
        # FlashMLA sizes its schedule by the GPU's SMs (its get_mla_metadata asks the device)
        wanted = resolved_options(model_runner, self, num_heads=self.num_q_heads, num_kv_heads=1,
                                  **device_sms(model_runner.device))
        self._attach(compiled, wanted, self.req_to_token, model_runner.device)

    def unserved(self) -> list[str]:
        checks = ((self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self.dcp_world_size > 1, "decode context parallelism"),
                  # FlashMLA schedules an FP8 cache with another scheduler (its dense FP8 kernel's)
                  (self.is_fp8_kvcache, "an FP8 KV cache"))
        return [name for bad, name in checks if bad]

    def _shape(self, m, v):
        from sglang.srt.layers.attention.flashmla_backend import FlashMLADecodeMetadata

        # decode and verify kernels take their key lengths from the batch; draft extend's from here
        keys = m.cache_seqlens if v.forward_mode.is_draft_extend() else None
        return FlashMLADecodeMetadata(m.tile_scheduler_metadata, m.num_splits, m.block_kv_indices, keys)


__all__ = ["FlashMLABackend"]
