"""What a server gains: SGLang's real ``Engine`` on Llama-3.2-1B- and Llama-3.1-8B-shaped models (random weights:
``load_format="dummy"``, nothing downloaded), SGLang's own attention backend against attnmeta's of the same kind,
each engine in a process of its own, in both orders (SGLang's, attnmeta's, attnmeta's, SGLang's: a drift over the
run weighs on both sides alike), greedy, the tokens of each pair compared.

    python tools/bench_engine.py run --shapes 1b --kinds triton,flashinfer --topk 0,4 --json docs/engine-bench.json
    python tools/bench_engine.py plot docs/engine-bench.json --png docs/engine-bench.png
    python tools/bench_engine.py table docs/engine-bench.json
    python tools/bench_engine.py plan --shapes 1b,8b            # no GPU: every engine's arguments, through SGLang's
                                                                # own ServerArgs, and what a run would start

On the lent GPU, ``tools/h200.sh`` sets the machine up first (SGLang's kernel package is its stand-in there:
torch-only bodies for the norms, activations and rotary embedding, the same on both sides; said in the output).
Per engine: plain decode at batches 1, 8, 32, 64 (topk 0), or EAGLE (3 steps, a one-layer draft of the same width)
at batches 1 and 8. Per batch: the median over ``--reps`` of a prefill-only request (one new token) and of a
``--tokens``-token decode; the decode step (or EAGLE round) is their difference over the steps (rounds) between.
A ``run`` adds to its ``--json`` file, so a run cut short by the device's limit is resumed by the same command.
Each ``run`` first starts one short engine and discards it (``--no-warmup``: not): a fresh machine's first engine
was measured 10-20% slower a step than the same engine started later.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = {  # the published configs' attention and width; vocab and context as served, layers as the model's
    "1b": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 64, "intermediate_size": 8192, "tie_word_embeddings": True},
    "8b": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "intermediate_size": 14336, "tie_word_embeddings": False},
}
KINDS = ("triton", "flashinfer", "fa3")
PLAIN_BATCHES, EAGLE_BATCHES = (1, 8, 32, 64), (1, 8)
PROMPT = 256  # prompt tokens per request
CONTEXT = 4096


def config(shape: str, draft: bool = False) -> dict:
    c = {"architectures": ["LlamaForCausalLMEagle" if draft else "LlamaForCausalLM"], "model_type": "llama",
         "vocab_size": 128256, "max_position_embeddings": CONTEXT, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
         "torch_dtype": "bfloat16", "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
         **SHAPES[shape]}
    if draft:
        c["num_hidden_layers"] = 1
    return c


def model_dir(root: str, shape: str, draft: bool = False) -> str:
    """A folder holding only ``config.json``: the dummy load format draws every weight."""
    path = os.path.join(root, f"{shape}{'-draft' if draft else ''}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config(shape, draft), f)
    return path


def cell_name(shape: str, kind: str, topk: int) -> str:
    return f"{shape}/{kind}/{'decode' if topk == 0 else f'eagle-topk{topk}'}"


def batches(topk: int) -> tuple[int, ...]:
    return PLAIN_BATCHES if topk == 0 else EAGLE_BATCHES


def engine_args(root: str, shape: str, backend: str, topk: int) -> dict:
    """``sglang.Engine``'s keyword arguments for one engine (the same for both sides but the backend)."""
    sizes = list(batches(topk))
    kw = dict(model_path=model_dir(root, shape), load_format="dummy", skip_tokenizer_init=True, random_seed=0,
              context_length=CONTEXT, mem_fraction_static=0.7, cuda_graph_bs_decode=sizes,
              cuda_graph_max_bs_decode=max(sizes), disable_prefill_cuda_graph=True, sampling_backend="pytorch",
              grammar_backend="none", attention_backend=backend, page_size=1, log_level="warning",
              max_running_requests=max(sizes))
    if topk:
        kw |= dict(speculative_algorithm="EAGLE", speculative_draft_model_path=model_dir(root, shape, draft=True),
                   speculative_draft_load_format="dummy", speculative_eagle_topk=topk, speculative_num_steps=3,
                   speculative_num_draft_tokens=4 if topk == 1 else 8)
    return kw


def prompts(n: int) -> list[list[int]]:
    return [[(97 * i + 31 * j) % 120000 + 1000 for j in range(PROMPT)] for i in range(n)]


# --- one engine, in a process of its own (SGLang's scheduler processes re-import this file as their main module:
# the registration below reaches them too) ---
def _register() -> None:
    try:
        from attnmeta.integrations.sglang import register
    except ImportError:  # the plan and the table need no SGLang
        return
    register()


def serve(root: str, shape: str, backend: str, topk: int, tokens: int, reps: int) -> dict:
    """One engine's measurements: per batch, the median prefill-only and decode times, the step (round), the
    output tokens per second, EAGLE's rounds and accepted tokens per round; and the greedy tokens it served."""
    import sglang

    t0 = time.time()
    engine = sglang.Engine(**engine_args(root, shape, backend, topk))
    out = {"backend": backend, "start_s": round(time.time() - t0, 1), "timed": {}}
    try:
        check = engine.generate(input_ids=prompts(8), sampling_params={"temperature": 0.0, "max_new_tokens": 32},
                                return_logprob=True, top_logprobs_num=2)
        out["tokens"] = [o["output_ids"] for o in check]
        out["top2"] = [[[[int(t), round(float(lp), 5)] for lp, t, *_ in step or []]
                        for step in o["meta_info"].get("output_top_logprobs", [])] for o in check]
        for b in batches(topk):
            ps, first, whole, rounds, accepted = prompts(b), [], [], [], []
            one = {"temperature": 0.0, "max_new_tokens": 1}
            many = {"temperature": 0.0, "max_new_tokens": tokens, "ignore_eos": True}
            engine.generate(input_ids=ps, sampling_params=many)  # warm: this size's graphs and kernels
            for _ in range(reps):
                s = time.perf_counter()
                engine.generate(input_ids=ps, sampling_params=one)
                first.append(time.perf_counter() - s)
                s = time.perf_counter()
                res = engine.generate(input_ids=ps, sampling_params=many)
                whole.append(time.perf_counter() - s)
                verify = [o["meta_info"].get("spec_verify_ct") or 0 for o in res]
                rounds.append(max(verify))
                per = [len(o["output_ids"]) / v for o, v in zip(res, verify, strict=True) if v]
                accepted.append(statistics.mean(per) if per else 0.0)
            t1, tn = statistics.median(first), statistics.median(whole)
            steps = statistics.median(rounds) if topk else tokens
            out["timed"][str(b)] = {"prefill_s": round(t1, 5), "decode_s": round(tn, 5),
                                    "tok_per_s": round(b * tokens / tn, 1),
                                    "step_ms": round((tn - t1) / max(steps - 1, 1) * 1e3, 4),
                                    **({"rounds": rounds, "accepted_per_round": round(statistics.median(accepted), 3)}
                                       if topk else {})}
    finally:
        engine.shutdown()
    return out


# --- the driver: pairs of engines in both orders ---
def run(args) -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_engine: no CUDA device here; SGLang's engine serves with CUDA graphs on a GPU only. "
              "`python tools/bench_engine.py plan` shows (and checks) what a run would start.", file=sys.stderr)
        return 2
    results = json.load(open(args.json)) if os.path.exists(args.json) else {}
    results.setdefault("_machine", {"gpu": torch.cuda.get_device_name(), "kernels": kernel_package()})
    root = tempfile.mkdtemp(prefix="attnmeta-engine-")
    warm = not args.warmup
    for shape, kind, topk in plan_cells(args):
        name = cell_name(shape, kind, topk)
        done = results.setdefault(name, {})
        for order, backend in enumerate((kind, f"attnmeta_{kind}", f"attnmeta_{kind}", kind)):
            key = f"{backend}#{1 + order // 2}"
            if key in done and "error" not in done[key]:
                continue
            if not warm:
                # A fresh machine's first engine ran 10-20% slower a step than the same engine started later (its
                # start also compiled the kernels' caches): that would weigh on whichever side goes first. One
                # engine, short, thrown away, before the first that counts.
                warm = True
                got = _serve([root, shape, backend, topk, min(args.tokens, 16), 1])
                print("warm-up engine", backend, "(discarded)", got.get("error", "")[-300:], flush=True)
            done[key] = _serve([root, shape, backend, topk, args.tokens, args.reps])
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
            print(name, key, done[key].get("error", "")[-300:] or
                  {b: t["step_ms"] for b, t in done[key]["timed"].items()}, flush=True)
    print(table(results))
    return 0


def _serve(spec: list) -> dict:
    """One engine in a process of its own: its result, or the end of its stderr."""
    p = subprocess.run([sys.executable, __file__, "serve", json.dumps(spec)], capture_output=True, text=True)
    line = next((x for x in reversed(p.stdout.splitlines()) if x.startswith("{")), None)
    return json.loads(line) if p.returncode == 0 and line else {"error": p.stderr[-3000:]}


def kernel_package() -> str:
    try:
        import sgl_kernel
    except ImportError:
        return "none"
    return "stand-in (torch-only bodies)" if "standin" in getattr(sgl_kernel, "__version__", "") else "sgl_kernel"


def plan_cells(args) -> list[tuple[str, str, int]]:
    return [(s, k, t) for s in args.shapes.split(",") for k in args.kinds.split(",")
            for t in map(int, args.topk.split(","))]


# --- what a run measured ---
NEAR_TIE = 0.125  # the engine test's rounding allowance (tests/gpu/test_sglang_engine.py): one bf16 logit step


def tokens_verdict(a: dict, b: dict) -> str:
    """``equal``, ``near-tie at k`` (both tokens within one rounding step of the likeliest) or ``DIFFER at k``."""
    for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"], strict=True)):
        k = next((k for k, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), None)
        if k is None:
            continue
        top = {int(t): lp for t, lp in a["top2"][i][k]} if k < len(a["top2"][i]) else {}
        best = max(top.values(), default=0.0)
        tie = all(t in top and best - top[t] <= NEAR_TIE for t in (x[k], y[k]))
        return f"{'near-tie' if tie else 'DIFFER'} at prompt {i} token {k}"
    return "equal"


def rows(results: dict) -> list[dict]:
    out = []
    for name, runs in results.items():
        if name.startswith("_"):
            continue
        kind = name.split("/")[1]
        need = [f"{kind}#1", f"attnmeta_{kind}#1", f"attnmeta_{kind}#2", f"{kind}#2"]
        if any(k not in runs or "error" in runs[k] for k in need):
            out.append({"cell": name, "missing": [k for k in need if k not in runs or "error" in runs[k]]})
            continue
        s1, a1, a2, s2 = (runs[k] for k in need)
        toks = sorted({tokens_verdict(s1, a1), tokens_verdict(s2, a2)})
        for b in s1["timed"]:
            t = {k: r["timed"][b] for k, r in zip(("s1", "a1", "a2", "s2"), (s1, a1, a2, s2), strict=True)}
            r1, r2 = t["a1"]["step_ms"] / t["s1"]["step_ms"], t["a2"]["step_ms"] / t["s2"]["step_ms"]
            mean, spread = (r1 + r2) / 2, abs(r1 - r2)
            out.append({"cell": name, "batch": int(b), "tokens": "; ".join(toks),
                        "sglang_ms": statistics.mean([t["s1"]["step_ms"], t["s2"]["step_ms"]]),
                        "attnmeta_ms": statistics.mean([t["a1"]["step_ms"], t["a2"]["step_ms"]]),
                        "sglang_tok_s": statistics.mean([t["s1"]["tok_per_s"], t["s2"]["tok_per_s"]]),
                        "attnmeta_tok_s": statistics.mean([t["a1"]["tok_per_s"], t["a2"]["tok_per_s"]]),
                        "ratio": mean, "spread": spread, "noise": spread >= abs(1 - mean),
                        "accepted": [t[k].get("accepted_per_round") for k in ("s1", "a1")]})
    return out


def table(results: dict) -> str:
    m = results.get("_machine", {})
    lines = [f"GPU: {m.get('gpu', '?')}; SGLang's kernel package: {m.get('kernels', '?')}",
             "| cell | batch | SGLang step ms | attnmeta step ms | attnmeta / SGLang (spread over orders) | "
             "tok/s SGLang / attnmeta | accepted per round | tokens |", "|---|---|---|---|---|---|---|---|"]
    for r in rows(results):
        if "missing" in r:
            lines.append(f"| {r['cell']} | | not run: {', '.join(r['missing'])} | | | | | |")
            continue
        verdict = "within noise" if r["noise"] else f"{r['ratio']:.3f}"
        acc = " / ".join(f"{a:.2f}" for a in r["accepted"] if a is not None) or "-"
        lines.append(f"| {r['cell']} | {r['batch']} | {r['sglang_ms']:.3f} | {r['attnmeta_ms']:.3f} | {verdict} "
                     f"({r['ratio']:.3f} ± {r['spread'] / 2:.3f}) | {r['sglang_tok_s']:.0f} / "
                     f"{r['attnmeta_tok_s']:.0f} | {acc} | {r['tokens']} |")
    return "\n".join(lines)


def plot(results: dict, png: str) -> None:
    """Decode step time by batch size, SGLang's backend and attnmeta's per kind, one panel per model shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    got = [r for r in rows(results) if "missing" not in r and r["cell"].endswith("/decode")]
    shapes = sorted({r["cell"].split("/")[0] for r in got}) or ["(nothing measured)"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        for kind in sorted({r["cell"].split("/")[1] for r in got if r["cell"].startswith(shape + "/")}):
            mine = sorted((r for r in got if r["cell"] == f"{shape}/{kind}/decode"), key=lambda r: r["batch"])
            xs = [r["batch"] for r in mine]
            line = ax.plot(xs, [r["sglang_ms"] for r in mine], "o--", label=f"SGLang {kind}")[0]
            ax.plot(xs, [r["attnmeta_ms"] for r in mine], "s-", color=line.get_color(), label=f"attnmeta_{kind}")
        ax.set_xscale("log", base=2)
        ticks = sorted({r["batch"] for r in got})
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_title(f"Llama-{shape.upper()}-shaped model, plain decode")
        ax.set_xlabel("batch size")
        ax.set_ylabel("decode step (ms)")
        ax.set_ylim(bottom=0)  # from zero: the gap drawn is the gap measured, not a zoom on it
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    gpu = results.get('_machine', {}).get('gpu')
    fig.suptitle(f"SGLang's engine: its own attention backends and attnmeta's\n({gpu}, "
                 f"kernel package: {results.get('_machine', {}).get('kernels', 'real')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def show_plan(args) -> int:
    """Every engine a run would start, its arguments checked by SGLang's own ``ServerArgs`` (its rules for the
    backend, EAGLE and CUDA graphs run there) and its backend by SGLang's ``--attention-backend`` choices (no GPU
    needed)."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
    from sglang.srt.server_args import ServerArgs

    _register()
    root = tempfile.mkdtemp(prefix="attnmeta-engine-")
    for shape, kind, topk in plan_cells(args):
        for backend in (kind, f"attnmeta_{kind}"):
            kw = engine_args(root, shape, backend, topk)
            sa = ServerArgs(**kw)
            if sa.attention_backend not in ATTENTION_BACKEND_CHOICES:
                raise SystemExit(f"{backend}: not one of SGLang's --attention-backend choices here")
            print(cell_name(shape, kind, topk), backend, f"attention={sa.attention_backend}",
                  f"batches={list(batches(topk))}", f"speculative={sa.speculative_algorithm}", flush=True)
    print(f"a run: 4 engines per cell (SGLang's, attnmeta's, attnmeta's, SGLang's), {len(plan_cells(args))} cells")
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:  # one engine, its result as the last line of stdout
        root, shape, backend, topk, tokens, reps = json.loads(argv[1])
        _register()
        print(json.dumps(serve(root, shape, backend, topk, tokens, reps)), flush=True)
        return 0
    p = argparse.ArgumentParser(prog="tools/bench_engine.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("run", "plan"):
        s = sub.add_parser(name)
        s.add_argument("--shapes", default="1b,8b", help=f"model shapes, of {sorted(SHAPES)}")
        s.add_argument("--kinds", default="triton,flashinfer", help=f"attention kinds, of {KINDS}")
        s.add_argument("--topk", default="0,4", help="0: plain decode (batches 1, 8, 32, 64); k: EAGLE topk k (1, 8)")
        s.add_argument("--tokens", type=int, default=128, help="new tokens per timed request")
        s.add_argument("--reps", type=int, default=3)
        s.add_argument("--json", default="engine-bench.json", help="results, added to (a run resumes)")
        s.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="no discarded engine before the first timed one (a machine already warm)")
    for name in ("plot", "table"):
        s = sub.add_parser(name)
        s.add_argument("json")
        s.add_argument("--png", default="docs/engine-bench.png")
    a = p.parse_args(argv)
    if a.cmd in ("run", "plan"):
        bad = [x for x in a.shapes.split(",") if x not in SHAPES] + [x for x in a.kinds.split(",") if x not in KINDS]
        if bad or any(not t.isdigit() or int(t) not in (0, 1, 4) for t in a.topk.split(",")):
            p.error(f"unknown shape, kind or topk in {a.shapes!r} {a.kinds!r} {a.topk!r}: shapes {sorted(SHAPES)}, "
                    f"kinds {list(KINDS)}, topk 0 (plain decode), 1 or 4")
        return run(a) if a.cmd == "run" else show_plan(a)
    results = json.load(open(a.json))
    if a.cmd == "table":
        print(table(results))
    else:
        plot(results, a.png)
        print("wrote", a.png)
    return 0


if __name__ == "__mp_main__":  # SGLang's scheduler processes (spawned: this file re-imported under that name)
    _register()
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
