"""attnmeta inside SGLang (optional extra ``attnmeta[sglang]``).

- ``TritonBackend``, ``FlashInferBackend``, ``FlashAttentionBackend``: SGLang ``AttentionBackend``
  subclasses over a compiled attnmeta backend, serving SGLang's ``ForwardBatch`` in decode, idle,
  target verify and draft extend V2, eager and under SGLang's CUDA-graph runner;
- ``DSV4Backend``: SGLang's own DeepSeek-V4 backend with decode, idle, target verify and draft extend V2
  metadata compiled (``dsv4_backend.py``; ``dsv4.forward_metadata`` builds SGLang's ``DSV4Metadata``);
- ``compile_options(server_args, model_config)``: the compile options SGLang's runner implies;
- ``register()``: the backends in SGLang's attention-backend registry (``--attention-backend
  attnmeta_triton``, ``attnmeta_dsv4`` ...).

The batch mapping (``BatchView``, ``attnmeta_mode``) and the options need no SGLang; the backends do.
"""

from .batch import MODES, BatchView, attnmeta_mode
from .options import compile_options

__all__ = ["MODES", "AttnmetaBackend", "BatchView", "DSV4Backend", "FlashAttentionBackend", "FlashInferBackend",
           "TritonBackend",
           "attnmeta_mode", "compile_options", "factory", "register"]

_LAZY = {"AttnmetaBackend": "backend", "TritonBackend": "backend", "FlashInferBackend": "backend",
         "FlashAttentionBackend": "backend", "DSV4Backend": "dsv4_backend", "factory": "registry",
         "register": "registry"}


def __getattr__(name):  # the SGLang-facing classes import SGLang: only when asked for
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(name)
