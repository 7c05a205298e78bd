"""The engine's configuration as the test configuration: each backend compiled with every mode it
serves in one backend, graphs captured per (mode, size), and random interleavings of DECODE,
IDLE, TARGET_VERIFY, DRAFT_EXTEND (and eager EXTEND) at padded, exact and uncaptured sizes; every
step equal to the reference interpreter and the eager twin (tests/engine.py). The slow tier runs
2000 steps per backend."""

import pytest

from tests.engine import BACKENDS, build, interleave

VARIANTS = [
    ("flashattention", {"P": 16}),
    ("flashattention", {"P": 64, "L": 256}),
    ("trtllm_mha", {"P": 16}),  # TRT-LLM MHA: FlashAttention's metadata, draft extend strided
    ("tbo_trtllm_mha", {"P": 32, "L": 200}),
    ("flashattention_draft", {"P": 16}),
    ("multistep_flashinfer", {"K": 2}),
    ("multistep_triton", {"K": 3, "P": 16, "L": 160}),
    ("tbo_triton", {"sizes": (1, 2, 5), "max_bs": 7}),
    ("flashinfer", {"L": 4096, "max_bs": 4, "sizes": (1, 2)}),  # long context (bug class 22)
    ("flashinfer_mla", {"P": 64, "L": 256}),  # DeepSeek's 64-token pages (FlashInfer reads token slots)
    ("tbo_flashinfer_mla", {"sizes": (1, 2, 5), "max_bs": 7}),
    ("trtllm_mla", {"P": 64, "L": 256}),  # TRT-LLM MLA serves pages of 32 and 64 tokens
    ("trtllm_mla", {"P": 32, "L": 200}),
    ("tbo_trtllm_mla", {"P": 64, "L": 256}),
    ("cutedsl_mla", {"P": 64, "L": 256}),  # CuTe-DSL MLA: TRT-LLM MLA's metadata
    # FlashMLA: 64-token pages, its tile scheduler in the graph, on a GPU of 16 SMs: 16 parts a step, where requests
    # split across parts more often than across an H200's 132 (and Triton's interpreter walks a tenth of the parts;
    # tests/runtime/test_flashmla.py holds the kernel to FlashMLA's schedule at 132, 78 and 16)
    ("flashmla", {"P": 64, "L": 256, "SM": 16}),
    ("tbo_flashmla", {"P": 64, "L": 320, "SM": 16}),
]


def _ok(name, kw, steps, seed):
    eng = build(name, **kw)
    failures = interleave(eng, steps, seed)
    assert failures == [], f"{name} {kw}: {len(failures)} failing steps, first {failures[:3]}"
    assert eng.stats.get("replay", 0) and eng.stats.get("eager", 0)  # both paths ran


@pytest.mark.parametrize("name", BACKENDS)
def test_interleaved_modes(name):
    # DSV4's kernels are the slowest in Triton's interpreter (a second a step): 30 steps still interleave its
    # every mode several times; the slow tier's long run takes 2000
    _ok(name, {}, 30 if name == "dsv4" else 60, seed=7)


@pytest.mark.parametrize(("name", "kw"), VARIANTS, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in kw.items())}"
                                                        for n, kw in VARIANTS])
def test_interleaved_modes_variants(name, kw):
    _ok(name, kw, 40, seed=11)


@pytest.mark.slow
@pytest.mark.parametrize("name", BACKENDS)
def test_interleaved_modes_long_run(name):
    _ok(name, {}, 2000, seed=2026)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kw"), VARIANTS, ids=[f"{n}-{'-'.join(f'{k}{v}' for k, v in kw.items())}"
                                                        for n, kw in VARIANTS])
def test_interleaved_modes_long_run_variants(name, kw):
    _ok(name, kw, 2000, seed=2027)
