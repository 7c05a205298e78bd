"""The engine integrations' tests need SGLang's and vLLM's real classes (``make sglang-venv``). Each
test module skips where its engine is missing; ``make test`` runs them in the engines' venv with
ATTNMETA_SGLANG_VENV=1, where a missing engine fails the run instead."""

import os

if os.environ.get("ATTNMETA_SGLANG_VENV") == "1":
    import sglang.srt.layers.attention.base_attn_backend  # noqa: F401
    import vllm.v1.attention.backend  # noqa: F401

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _attnmeta_kernels(request):
    """attnmeta's fused kernels here run as the torch lowering (the op table, as the demo runs them), SGLang's own
    kernels in Triton's interpreter: these tests check how attnmeta serves SGLang's batches against SGLang's own
    backends; the kernels themselves are checked in the interpreter by tests/runtime and tests/lowering, and here
    by the tests marked ``triton_kernels`` (the launches a replay makes)."""
    from attnmeta.compiler.lowering import triton_kernels

    if not triton_kernels.INTERPRET or request.node.get_closest_marker("triton_kernels") is not None \
            or os.environ.get("ATTNMETA_INTEGRATION_KERNELS") == "triton":
        yield
        return
    triton_kernels.set_cpu_kernels("torch")
    try:
        yield
    finally:
        triton_kernels.set_cpu_kernels("triton")
