"""SGLang's real engine serving the same prompts through several attention backends, one engine after
another in this process (run as a script: SGLang's engine spawns its scheduler processes, which
re-import this file as their main module, so ``register()`` at the top reaches them too).

    python tests/gpu/sglang_engine.py OUT.json CONFIG [CONFIG ...]

CONFIG is ``backend:page_size[:eagle_topk][@model]``, e.g. ``triton:1``, ``attnmeta_flashinfer:16:4``,
``flashinfer:16@gemma``. Each engine: a small seeded one-layer Llama (``checkpoints`` says why these weights), or with
``@window`` a two-layer OLMo 2 whose first layer attends through a sliding window (``window_model``), or with
``@gemma`` a two-layer Gemma 2 windowed the same way (``gemma_model``: SGLang serves FlashInfer on Gemma 2, not OLMo 2),
CUDA graphs on for
decode (sizes 1, 2, 4, 8), greedy decoding of fixed prompts given as token ids; with a topk, EAGLE with
a draft that proposes the target's own tokens (a window model: itself, through SGLang's STANDALONE drafting).
OUT.json maps each config to its output token ids and
logprobs, EAGLE's verify rounds and accepted drafts, seconds to start and to generate, or to the error
it raised.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

from attnmeta.integrations.sglang import register

register()
PROFILE = os.environ.get("ATTNMETA_ENGINE_PROFILE")  # a path prefix: engine_profile.py says what it records
if PROFILE:
    import engine_profile

    engine_profile.install()

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512,
         "intermediate_size": 1024, "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2,
         "head_dim": 64, "vocab_size": 1024, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
         "rope_theta": 10000.0, "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": False}
DRAFT = {**LLAMA, "architectures": ["LlamaForCausalLMEagle"]}
PROMPTS = [[(7 * i + 3 * j) % 1000 + 1 for j in range(n)] for i, n in enumerate((5, 17, 33, 64, 130, 9))]
NEW_TOKENS = 24
LONG = 128  # the timed second request: decode steps dominate it
TOP = 5  # likeliest tokens recorded per step of a window model's plain long decode (the near-tie record)
# timing (tools/h200_verify.sh enginetime-a, -b): batch sizes of the timed decodes (the prompts repeated; captured
# graphs cover them) and how many times each is timed after a warm one; the default is the correctness run's
BATCHES = [int(x) for x in os.environ.get("ATTNMETA_ENGINE_BATCHES", "").split(",") if x]
REPS = int(os.environ.get("ATTNMETA_ENGINE_REPS", "1"))


def model(folder: str, config: dict, weights: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    from safetensors.torch import save_file

    save_file({k: t.clone() for k, t in weights.items()}, os.path.join(folder, "model.safetensors"))
    return folder


def checkpoints() -> tuple[dict, dict]:
    """A one-layer Llama and an EAGLE draft that computes the same next token, both seeded.

    The target: SGLang's ``dummy`` load format draws every weight (norms included) from U(-1e-3, 1e-3),
    which leaves attention about 1e-6 of the residual stream, so the greedy tokens follow the last token
    alone and wrong metadata would serve the same tokens. Here q/k are large enough for sharp,
    position-dependent attention and v/o carry as much as the residual: a wrong page or length changes
    what is served.

    The draft: EAGLE's layer reads ``fc(embedding, target hidden)`` with no input norm and no final norm
    (the lm_head is the target's). With ``fc = [I, 0]``, embedding rows of RMS 1 (so the target's input
    norm is the identity on them) and the target's layer weights, the draft's layer sees the target's
    input, keeps the target's KV, and its logits are the target's up to a positive scale: it proposes
    the target's own greedy token. Acceptance is then close to every draft when the draft's metadata is
    right, and drops when a draft step reads the wrong keys, which token equality alone cannot show
    (the target verifies every token whatever the draft proposed)."""
    import torch

    g = torch.Generator().manual_seed(0)
    c = LLAMA
    h, d, inter, vocab = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d

    def w(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) * std).to(torch.bfloat16)

    ones = torch.ones(h, dtype=torch.bfloat16)
    embed = torch.randn(vocab, h, generator=g)
    embed = (embed / embed.pow(2).mean(-1, keepdim=True).sqrt()).to(torch.bfloat16)
    layer = {"post_attention_layernorm.weight": ones,
             "self_attn.q_proj.weight": w(q, h, 0.1), "self_attn.k_proj.weight": w(kv, h, 0.1),
             "self_attn.v_proj.weight": w(kv, h, h ** -0.5), "self_attn.o_proj.weight": w(h, q, q ** -0.5),
             "mlp.gate_proj.weight": w(inter, h, h ** -0.5), "mlp.up_proj.weight": w(inter, h, h ** -0.5),
             "mlp.down_proj.weight": w(h, inter, inter ** -0.5)}
    target = {"model.embed_tokens.weight": embed, "model.norm.weight": ones, "lm_head.weight": w(vocab, h, h ** -0.5),
              "model.layers.0.input_layernorm.weight": ones, **{f"model.layers.0.{k}": t for k, t in layer.items()}}
    fc = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1).to(torch.bfloat16)
    draft = {"embed_tokens.weight": embed, "fc.weight": fc, "fc.bias": torch.zeros(h, dtype=torch.bfloat16),
             **{f"layers.0.{k}": t for k, t in layer.items()}}  # EAGLE's loader adds the "model." prefix
    return target, draft


# OLMo 2 with a sliding first layer (HF's ``layer_types``; SGLang's window is ``sliding_window - 1`` past the
# current token), in one KV pool: SGLang 0.5.23's model overrides turn its hybrid layout (a window pool whose slots
# are translated from the full pool's) off for OLMo 2 and Gemma 2 even where the config opts in (``is_hybrid_swa``),
# so that layout is checked on the CPU against SGLang's own classes (tests/integrations), not here
WINDOW = {"architectures": ["Olmo2ForCausalLM"], "model_type": "olmo2", "hidden_size": 512, "intermediate_size": 1024,
          "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1024,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "attention_bias": False,
          "torch_dtype": "bfloat16", "hidden_act": "silu", "tie_word_embeddings": False, "sliding_window": 9,
          "layer_types": ["sliding_attention", "full_attention"]}
# Gemma 2, its first layer sliding (the same window): SGLang refuses FlashInfer for OLMo 2, and serves Gemma 2 with it
GEMMA = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 512, "intermediate_size": 1024,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024,
         "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False,
         "torch_dtype": "bfloat16", "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
         "query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
         "sliding_window": 9, "tie_word_embeddings": True, "layer_types": ["sliding_attention", "full_attention"],
         "bos_token_id": 2, "eos_token_id": 50279, "pad_token_id": 0}


def seeded(c: dict, top, layer, gain_shift: float = 0.0) -> dict:
    """Seeded bf16 weights for the config ``c``: ``top(w, gain)`` the model's own tensors, then ``layer(w, gain)``
    once per layer, named under it (the draws in that order, so a model's weights stay the same). ``w(rows, cols,
    std)``: normal; ``gain(n, x)``: a norm's weight for gain ``x`` (stored as ``x - gain_shift``: Gemma's norms
    scale by 1 + weight)."""
    import torch

    g = torch.Generator().manual_seed(1)

    def w(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) * std).to(torch.bfloat16)

    def gain(n: int, x: float) -> torch.Tensor:
        return torch.full((n,), x - gain_shift, dtype=torch.bfloat16)

    out = top(w, gain)
    for i in range(c["num_hidden_layers"]):
        out |= {f"model.layers.{i}.{k}": t for k, t in layer(w, gain).items()}
    return out


def gemma_model() -> dict:
    """Gemma 2's weights, seeded (its norms scale by 1 + weight; the lm_head is the embedding). Embeddings of RMS
    1 after Gemma's sqrt(hidden) scaling, q and k twice the usual scale (scores of standard deviation about 4),
    and the attention's output norm at gain 8, so attention, not the current token's own embedding, decides
    the next token: in a float32 reading of this model by HF transformers (greedy, first three prompts),
    windows of 8, 9 and 10 keys with the current one, and none, each serve different tokens within 24."""
    c = GEMMA
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    return seeded(c, lambda w, gain: {"model.embed_tokens.weight": w(vocab, h, h ** -0.5),
                                      "model.norm.weight": gain(h, 3.0)},
                  lambda w, gain: {
        "self_attn.q_proj.weight": w(h, h, 2 * h ** -0.5), "self_attn.k_proj.weight": w(kv, h, 2 * h ** -0.5),
        "self_attn.v_proj.weight": w(kv, h, h ** -0.5), "self_attn.o_proj.weight": w(h, h, h ** -0.5),
        "input_layernorm.weight": gain(h, 1.0), "post_attention_layernorm.weight": gain(h, 8.0),
        "pre_feedforward_layernorm.weight": gain(h, 1.0), "post_feedforward_layernorm.weight": gain(h, 2.0),
        "mlp.gate_proj.weight": w(inter, h, h ** -0.5), "mlp.up_proj.weight": w(inter, h, h ** -0.5),
        "mlp.down_proj.weight": w(h, inter, inter ** -0.5)}, gain_shift=1.0)


def window_model() -> dict:
    """OLMo 2's weights, seeded: post-norm layers (no input norm), q and k normed over all heads. The norms'
    gains make attention sharp (scores of standard deviation about 4), so which keys the window keeps (the
    last 9 with the current one) decides the tokens: a window one token too wide or too narrow, or a wrong
    window slot, serves other tokens (a float32 torch reading of this model, greedy, first three prompts:
    windows of 7, 8 and 9 keys before the current one, and none, each serve different tokens within 24)."""
    c = WINDOW
    h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    return seeded(c, lambda w, gain: {"model.embed_tokens.weight": w(vocab, h, 1.0), "model.norm.weight": gain(h, 1.0),
                                      "lm_head.weight": w(vocab, h, h ** -0.5)},
                  lambda w, gain: {
        "self_attn.q_proj.weight": w(h, h, h ** -0.5), "self_attn.k_proj.weight": w(kv, h, h ** -0.5),
        "self_attn.v_proj.weight": w(kv, h, h ** -0.5), "self_attn.o_proj.weight": w(h, h, h ** -0.5),
        "self_attn.q_norm.weight": gain(h, 2.0), "self_attn.k_norm.weight": gain(kv, 2.0),
        "post_attention_layernorm.weight": gain(h, 1.0), "post_feedforward_layernorm.weight": gain(h, 1.0),
        "mlp.gate_proj.weight": w(inter, h, h ** -0.5), "mlp.up_proj.weight": w(inter, h, h ** -0.5),
        "mlp.down_proj.weight": w(h, inter, inter ** -0.5)})


WINDOW_MODELS = {"window": (WINDOW, window_model), "gemma": (GEMMA, gemma_model)}


GRAPH_SIZES = sorted({1, 2, 4, 8, *BATCHES})


def timed(engine, rows: int) -> dict:
    """``REPS`` greedy decodes of ``LONG`` tokens for ``rows`` prompts, after one untimed: the median's
    tokens per second, decode step (ms per token) and, under EAGLE, verify round (ms per round)."""
    import statistics

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]
    params = {"temperature": 0.0, "max_new_tokens": LONG, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)
    times, rounds = [], []
    for _ in range(REPS):
        t0 = time.perf_counter()
        out = engine.generate(input_ids=prompts, sampling_params=params)
        times.append(time.perf_counter() - t0)
        rounds.append(max(o["meta_info"].get("spec_verify_ct") or 0 for o in out))
    med = statistics.median(times)
    res = {"s": [round(t, 4) for t in times], "tok_per_s": round(LONG * rows / med, 1),
           "step_ms": round(med / LONG * 1e3, 3)}
    if max(rounds):
        res["round_ms"] = round(med / statistics.median(rounds) * 1e3, 3)
        res["rounds"] = rounds
    return res


def run(config: str, root: str) -> dict:
    import sglang

    config, _, which = config.partition("@")
    backend, page, *topk = config.split(":")
    if which:
        if which not in WINDOW_MODELS:
            raise ValueError(f"{config}@{which}: the window models are {sorted(WINDOW_MODELS)}")
        config_of, weights_of = WINDOW_MODELS[which]
        path = model(os.path.join(root, which), config_of, weights_of())
    else:
        target, draft = checkpoints()
        path = model(os.path.join(root, "llama"), LLAMA, target)
    kw = dict(model_path=path, load_format="safetensors",
              skip_tokenizer_init=True, random_seed=0, mem_fraction_static=0.3, max_total_tokens=32768,
              cuda_graph_bs_decode=GRAPH_SIZES, cuda_graph_max_bs_decode=max(GRAPH_SIZES),
              disable_prefill_cuda_graph=True, sampling_backend="pytorch", grammar_backend="none",
              attention_backend=backend, page_size=int(page), log_level="warning")
    if topk:
        # a window model drafts for itself (SGLang's STANDALONE: EAGLE's worker and graphs, a plain model as the
        # draft), so the draft runner is windowed too and proposes the target's own tokens
        kw |= dict(speculative_algorithm="STANDALONE" if which else "EAGLE",
                   speculative_draft_model_path=path if which else model(os.path.join(root, "draft"), DRAFT, draft),
                   speculative_eagle_topk=int(topk[0]), speculative_num_steps=3,
                   speculative_num_draft_tokens=4 if int(topk[0]) == 1 else 6)
        if which and backend.endswith("flashinfer"):  # FlashInfer's drafter has no window form (SGLang's asserts)
            kw["speculative_draft_attention_backend"] = backend.replace("flashinfer", "triton")
    # SGLang's own FlashInfer prefills a window model on its ragged path, which drops the window (attnmeta's
    # routes them to the paged one: integrations/sglang/backend.py); its own switch to the paged path, set for its
    # engine here, makes it the oracle of a correct prefill (the scheduler's processes read it at start)
    os.environ.pop("SGLANG_FLASHINFER_USE_PAGED", None)
    if which and backend == "flashinfer":
        os.environ["SGLANG_FLASHINFER_USE_PAGED"] = "1"
    t0 = time.time()
    engine = sglang.Engine(**kw)
    t1 = time.time()
    try:
        out = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": NEW_TOKENS},
                              return_logprob=True)
        t2 = time.time()
        # warm (kernels compiled, graphs captured): a longer decode, timed; its tokens are compared too
        long = engine.generate(input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": LONG})
        t3 = time.time()
        # a window model's plain long decode again, untimed, with each step's TOP likeliest tokens: where
        # EAGLE's tokens part from it, they say whether the step was a near-tie (the verify's and the decode's
        # kernels round differently) or a real difference; an EAGLE engine's own are never compared
        top = [] if not which or topk else engine.generate(
            input_ids=PROMPTS, sampling_params={"temperature": 0.0, "max_new_tokens": LONG}, return_logprob=True,
            top_logprobs_num=TOP)
        if PROFILE:
            engine_profile.mark(PROFILE)
        timing = {str(b): timed(engine, b) for b in BATCHES}
        if PROFILE:
            engine_profile.unmark(PROFILE, engine)
    finally:
        engine.shutdown()
    profile = {"profile": engine_profile.collect(PROFILE)} if PROFILE else {}
    # the logprobs say, where tokens differ, whether it was a near-tie (rounding) or a real difference
    return {"tokens": [o["output_ids"] for o in out], "start_s": round(t1 - t0, 1), "generate_s": round(t2 - t1, 2),
            "logprobs": [[round(float(lp[0]), 4) for lp in o["meta_info"].get("output_token_logprobs", [])]
                         for o in out],
            # EAGLE: verify rounds and drafts accepted per prompt (the draft's metadata decides these)
            "accepted": [o["meta_info"].get("spec_num_correct_drafts") for o in out],
            "verify_rounds": [o["meta_info"].get("spec_verify_ct") for o in out],
            "long_tokens": [o["output_ids"] for o in long], "long_s": round(t3 - t2, 3),
            # per prompt, per step: [[token, logprob], ...] likeliest first (SGLang gives (logprob, token, text))
            "long_top": [[[[int(t), round(float(lp), 4)] for lp, t, *_ in step or []]
                          for step in o["meta_info"].get("output_top_logprobs", [])] for o in top],
            "long_tok_per_s": round(LONG * len(PROMPTS) / (t3 - t2), 1), "timed": timing, **profile}


def main(argv: list[str]) -> None:
    path, configs = argv[0], argv[1:]
    # the fa3 stand-in's key width, the same for both backends (standin/sgl_kernel: its rounding follows the
    # page table's width, which is not metadata FA3 reads): the models' 2048-token context and the drafts
    os.environ.setdefault("ATTNMETA_STANDIN_KEYS", "2304")
    results = json.load(open(path)) if os.path.exists(path) else {}
    warm = os.environ.get("ATTNMETA_ENGINE_WARMUP")
    if warm:  # one engine run and thrown away first: the first engine of a call runs slower (measured: a third)
        try:
            run(warm, os.path.join(os.path.dirname(os.path.abspath(path)), "models"))
            print("warm-up", warm, "done (not recorded)", flush=True)
        except Exception as e:  # noqa: BLE001 - a failed warm-up is reported, and the timed engines still run
            print("warm-up", warm, "failed:", type(e).__name__, e, flush=True)
    seen: dict[str, int] = {}
    for c in configs:
        # an engine named twice in one run (a warm-up, or A-B-A) keeps every result: "name", "name#2", ...
        seen[c] = seen.get(c, 0) + 1
        key = c if seen[c] == 1 else f"{c}#{seen[c]}"
        try:
            results[key] = run(c, os.path.join(os.path.dirname(os.path.abspath(path)), "models"))
        except Exception as e:  # noqa: BLE001 - recorded for the test to report, with the traceback
            results[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        with open(path, "w") as f:
            json.dump(results, f)
        print(key, {k: v for k, v in results[key].items() if k != "traceback"}, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
