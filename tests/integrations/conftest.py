"""The engine integrations' tests need SGLang's and vLLM's real classes (``make sglang-venv``). Each
test module skips where its engine is missing; ``make test`` runs them in the engines' venv with
ATTNMETA_SGLANG_VENV=1, where a missing engine fails the run instead."""

import os

if os.environ.get("ATTNMETA_SGLANG_VENV") == "1":
    import sglang.srt.layers.attention.base_attn_backend  # noqa: F401
    import vllm.v1.attention.backend  # noqa: F401
