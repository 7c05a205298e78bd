"""The engine rig's prefill-window check (``tests/gpu/hf_reading.py``) can fail: the first tokens SGLang 0.5.23's
engine served through its own FlashInfer prefill on the rig's Gemma 2 (recorded on an H100, 2026-12-06, before
attnmeta_flashinfer routed window prefills to SGLang's paged path) equal HF's reading without a window and are
rejected against its windowed one; HF's own windowed argmax is accepted."""

import pytest

pytest.importorskip("transformers", reason="HF transformers is not installed here; make test-sglang runs this")

from tests.gpu.hf_reading import first_token_logprobs, unwindowed_prefills
from tests.gpu.sglang_engine import PROMPTS

# prompts 1..4 (17, 33, 64 and 130 tokens, past the 9-token window): the engine's first tokens then
RECORDED_UNWINDOWED = {1: 683, 2: 594, 3: 183, 4: 66}


def test_a_prefill_without_the_window_is_rejected_and_the_windowed_reading_accepted():
    prompts = [PROMPTS[i] for i in RECORDED_UNWINDOWED]
    served = list(RECORDED_UNWINDOWED.values())
    no_window = first_token_logprobs(prompts, window=0)
    assert [int(lp.argmax()) for lp in no_window] == served  # what that engine computed: no window at all
    assert [i for i, *_ in unwindowed_prefills(served, prompts)] == [0, 1, 2, 3]
    windowed = [int(lp.argmax()) for lp in first_token_logprobs(prompts)]
    assert unwindowed_prefills(windowed, prompts) == []
