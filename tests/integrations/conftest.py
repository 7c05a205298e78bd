"""The SGLang integration's tests need SGLang's real classes (``make sglang-venv``; ``make test`` runs
them there with ATTNMETA_SGLANG_VENV=1, which turns a missing SGLang into a failure, not a skip)."""

import os

import pytest

try:
    import sglang.srt.layers.attention.base_attn_backend  # noqa: F401
except ImportError as e:
    if os.environ.get("ATTNMETA_SGLANG_VENV") == "1":
        raise ImportError(f"SGLang does not import in the SGLang test environment: {e}") from e
    pytest.skip(f"SGLang is not installed here ({e}); make test-sglang runs these", allow_module_level=True)
