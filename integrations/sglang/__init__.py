"""attnmeta inside SGLang (optional extra ``attnmeta[sglang]``).

- ``TritonBackend``, ``FlashInferBackend``: SGLang's own ``TritonAttnBackend`` and
  ``FlashInferAttnBackend`` (subclasses) with the metadata of the modes SGLang captures (decode,
  idle, target verify, draft extend V2) compiled; prefill, extend and attention stay SGLang's;
- ``TritonDraftBackend``, ``FlashInferDraftBackend``: SGLang's EAGLE multi-step drafters, every draft
  step's metadata compiled into one recorded kernel (``draft.py``);
- ``DSV4Backend``: SGLang's own DeepSeek-V4 backend with its captured modes' metadata compiled
  (``dsv4_backend.py``; ``dsv4.forward_metadata`` builds SGLang's ``DSV4Metadata``);
- ``FlashInferMLABackend``, ``FlashMLABackend``, ``TRTLLMMLABackend``, ``CuteDSLMLABackend``,
  ``TRTLLMMHABackend``: SGLang's MLA-family and TRT-LLM backends the same way (``mla.py``,
  ``flashmla.py``, ``trtllm.py``; ``FlashMLABackend`` also needs FlashMLA installed, so it is not in
  ``__all__``);
- ``FA3Backend``: SGLang's FlashAttention-3 backend the same way (``fa3.py``; it needs SGLang's kernel
  package, so it is not in ``__all__`` either);
- ``compile_options(server_args, model_config)``: the compile options SGLang resolves for a server,
  for an artifact compiled ahead of serving;
- ``register()``: the backends in SGLang's attention-backend registry and its EAGLE draft factory
  (``--attention-backend attnmeta_triton`` ...).

The batch mapping (``BatchView``, ``attnmeta_mode``) needs no SGLang; everything else does.
"""

from .batch import MODES, BatchView, attnmeta_mode
from .kinds import classes

__all__ = ["MODES", "BatchView", "CuteDSLMLABackend", "DSV4Backend", "FlashInferBackend", "FlashInferDraftBackend",
           "FlashInferMLABackend", "TRTLLMMHABackend", "TRTLLMMLABackend", "TritonBackend",
           "TritonDraftBackend", "attnmeta_mode", "compile_options", "factory", "register"]

# every kind's classes (kinds.py's table), and the registry's functions
_LAZY = {**classes(), "factory": "registry", "register": "registry", "compile_options": "options"}


def __getattr__(name):  # the SGLang-facing pieces import SGLang: only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
