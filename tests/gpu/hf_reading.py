"""An independent reading of the engine rig's Gemma 2 (``sglang_engine.GEMMA``): HF transformers' own Gemma 2 in
float32 on the CPU, its sliding window in force from the prompt's first token (HF's window: the current token and
the ``sliding_window - 1`` before it, SGLang's too). It checks what every engine of the rig shares and the
engine-against-engine comparisons cannot see: the prefill's window. A prefill that drops the window (SGLang's
FlashInfer ragged path) serves, for a prompt longer than the window, a first token HF's windowed reading puts far
below its likeliest (measured: 1.8 to 12 nats), a rounding difference puts it within ``PREFILL_TIE``."""

from __future__ import annotations

import torch

# bf16 engine against float32 reading, the first token's log-probability: rounding moves it by hundredths to a tenth
# or two; a prefill that reads the wrong keys by far more
PREFILL_TIE = 0.5


def first_token_logprobs(prompts: list[list[int]], window: int | None = None) -> list[torch.Tensor]:
    """Per prompt, HF's float32 log-probabilities of the first generated token (``window``: another window than
    the rig's, for the check's own test; 0 or less: none)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.gpu.sglang_engine import GEMMA, gemma_model

    c = {k: v for k, v in GEMMA.items() if k not in ("architectures", "torch_dtype")}
    if window is not None:
        c["sliding_window"] = window if window > 0 else c["max_position_embeddings"]
    cfg = Gemma2Config(**c)
    cfg._attn_implementation = "eager"
    m = Gemma2ForCausalLM(cfg).eval()
    m.load_state_dict({k: v.float() for k, v in gemma_model().items()}, strict=False)
    if m.lm_head.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr():
        raise AssertionError("HF's Gemma 2 did not tie its lm_head to the embedding (the rig's checkpoint has none)")
    with torch.no_grad():
        return [torch.log_softmax(m(torch.tensor([p])).logits[0, -1].float(), -1) for p in prompts]


def unwindowed_prefills(first_tokens: list[int], prompts: list[list[int]]) -> list[tuple[int, int, float, int]]:
    """The prompts whose first token an engine served is more than ``PREFILL_TIE`` below HF's likeliest, as
    (prompt, token, its log-probability, HF's likeliest): empty when every prefill attended through the window."""
    out = []
    for i, (t, lp) in enumerate(zip(first_tokens, first_token_logprobs(prompts), strict=True)):
        if float(lp.max() - lp[t]) > PREFILL_TIE:
            out.append((i, t, round(float(lp[t]), 3), int(lp.argmax())))
    return out
