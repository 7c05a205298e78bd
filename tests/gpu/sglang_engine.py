"""SGLang's real engine serving the same prompts through several attention backends, one engine after
another in this process (run as a script: SGLang's engine spawns its scheduler processes, which
re-import this file as their main module, so ``register()`` at the top reaches them too).

    python tests/gpu/sglang_engine.py OUT.json CONFIG [CONFIG ...]

CONFIG is ``backend:page_size[:eagle_topk]``, e.g. ``triton:1``, ``attnmeta_flashinfer:16:4``. Each
engine: a small random-weight Llama (``load_format="dummy"``, fixed seed), CUDA graphs on for decode
(sizes 1, 2, 4, 8), greedy decoding of fixed prompts given as token ids; with a topk, EAGLE with a
one-layer random draft model. OUT.json maps each config to its output token ids, seconds to start and
to generate, or to the error it raised.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from attnmeta.integrations.sglang import register

register()

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": False}
DRAFT = {**LLAMA, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
PROMPTS = [[(7 * i + 3 * j) % 1000 + 1 for j in range(n)] for i, n in enumerate((5, 17, 33, 64, 130, 9))]
NEW_TOKENS = 24


def model(folder: str, config: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def run(config: str, root: str) -> dict:
    import sglang

    backend, page, *topk = config.split(":")
    kw = dict(model_path=model(os.path.join(root, "llama"), LLAMA), load_format="dummy", skip_tokenizer_init=True,
              random_seed=0, mem_fraction_static=0.3, cuda_graph_bs_decode=[1, 2, 4, 8], cuda_graph_max_bs_decode=8,
              disable_prefill_cuda_graph=True, sampling_backend="pytorch", grammar_backend="none",
              attention_backend=backend, page_size=int(page), log_level="warning")
    if topk:
        kw |= dict(speculative_algorithm="EAGLE", speculative_draft_model_path=model(os.path.join(root, "draft"),
                                                                                    DRAFT),
                   speculative_eagle_topk=int(topk[0]), speculative_num_steps=3,
                   speculative_num_draft_tokens=4 if int(topk[0]) == 1 else 6)
    t0 = time.time()
    engine = sglang.Engine(**kw)
    t1 = time.time()
    try:
        out = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": NEW_TOKENS})
        t2 = time.time()
    finally:
        engine.shutdown()
    return {"tokens": [o["output_ids"] for o in out], "start_s": round(t1 - t0, 1), "generate_s": round(t2 - t1, 2)}


def main(argv: list[str]) -> None:
    path, configs = argv[0], argv[1:]
    results = json.load(open(path)) if os.path.exists(path) else {}
    for c in configs:
        try:
            results[c] = run(c, os.path.join(os.path.dirname(os.path.abspath(path)), "models"))
        except Exception as e:  # noqa: BLE001 - recorded for the test to report, with the traceback
            results[c] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        with open(path, "w") as f:
            json.dump(results, f)
        print(c, {k: v for k, v in results[c].items() if k != "traceback"}, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
