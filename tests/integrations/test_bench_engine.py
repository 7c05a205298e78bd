"""The engine benchmark's CPU dry run (tools/bench_engine.py): every engine it would start passes SGLang's own
ServerArgs with its backend among SGLang's choices; without a GPU a run refuses, naming what to do; the table's
ratios, spreads and verdicts and the token comparison on results worked by hand; the plot is drawn."""

import json
import os
import runpy
import sys

import pytest

pytest.importorskip("sglang.srt.server_args", reason="SGLang is not installed here; make test-sglang runs these")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = runpy.run_path(os.path.join(ROOT, "tools", "bench_engine.py"), run_name="bench_engine")


def test_every_engine_of_a_run_passes_sglangs_server_args(capsys):
    assert BENCH["main"](["plan", "--shapes", "1b,8b", "--kinds", "triton,flashinfer,fa3", "--topk", "0,1,4"]) == 0
    out = capsys.readouterr().out.splitlines()
    engines = [x for x in out if "attention=" in x]
    assert len(engines) == 2 * 3 * 3 * 2  # shapes, kinds, topk, both sides
    assert "8b/fa3/eagle-topk4 attnmeta_fa3 attention=attnmeta_fa3 batches=[1, 8] speculative=EAGLE" in out
    assert out[-1].endswith("18 cells")


def test_the_models_are_the_published_shapes_and_the_draft_one_layer_of_the_same_width(tmp_path):
    kw = BENCH["engine_args"](str(tmp_path), "8b", "attnmeta_triton", 4)
    target = json.load(open(f"{kw['model_path']}/config.json"))
    draft = json.load(open(f"{kw['speculative_draft_model_path']}/config.json"))
    assert (target["hidden_size"], target["num_hidden_layers"], target["num_attention_heads"],
            target["num_key_value_heads"], target["head_dim"], target["intermediate_size"]) == (4096, 32, 32, 8, 128,
                                                                                                14336)
    assert draft["num_hidden_layers"] == 1 and draft["hidden_size"] == 4096
    assert draft["architectures"] == ["LlamaForCausalLMEagle"]
    assert (kw["load_format"], kw["speculative_eagle_topk"], kw["speculative_num_steps"],
            kw["speculative_num_draft_tokens"], kw["cuda_graph_bs_decode"]) == ("dummy", 4, 3, 8, [1, 8])
    one = BENCH["engine_args"](str(tmp_path), "1b", "triton", 0)
    assert one["cuda_graph_bs_decode"] == [1, 8, 32, 64] and "speculative_algorithm" not in one


def test_without_a_gpu_a_run_refuses_and_says_what_to_run(monkeypatch, capsys, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert BENCH["main"](["run", "--shapes", "1b", "--json", str(tmp_path / "r.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_an_unknown_shape_or_kind_is_named(capsys):
    with pytest.raises(SystemExit):
        BENCH["main"](["plan", "--kinds", "tritn"])
    assert "'tritn'" in capsys.readouterr().err


def _run(step_ms: dict[str, float], tokens=None, top2=None) -> dict:
    return {"tokens": tokens or [[1, 2, 3]], "top2": top2 or [[[[1, -0.1], [9, -2.0]]] * 3],
            "timed": {b: {"step_ms": ms, "tok_per_s": 100.0 / ms} for b, ms in step_ms.items()}}


def test_the_table_reports_each_order_and_calls_a_spread_wider_than_the_gain_noise():
    res = {"_machine": {"gpu": "test", "kernels": "none"},
           # batch 1: 0.8 and 0.9 of SGLang's step in the two orders: 0.85, spread 0.1, a gain
           # batch 8: 0.9 and 1.2: mean 1.05, spread 0.3 > 0.05: within noise
           "1b/triton/decode": {"triton#1": _run({"1": 10.0, "8": 10.0}),
                                "attnmeta_triton#1": _run({"1": 8.0, "8": 9.0}),
                                "attnmeta_triton#2": _run({"1": 9.0, "8": 12.0}),
                                "triton#2": _run({"1": 10.0, "8": 10.0})},
           "8b/triton/decode": {"triton#1": _run({"1": 10.0})}}
    rows = {(r["cell"], r.get("batch")): r for r in BENCH["rows"](res)}
    one, eight = rows[("1b/triton/decode", 1)], rows[("1b/triton/decode", 8)]
    assert one["ratio"] == pytest.approx(0.85) and one["spread"] == pytest.approx(0.1) and not one["noise"]
    assert eight["ratio"] == pytest.approx(1.05) and eight["noise"]
    assert one["tokens"] == "equal"
    text = BENCH["table"](res)
    assert "| 1b/triton/decode | 1 | 10.000 | 8.500 | 0.850 (0.850 ± 0.050)" in text
    assert "| 1b/triton/decode | 8 | 10.000 | 10.500 | within noise" in text
    assert "| 8b/triton/decode | | not run: attnmeta_triton#1, attnmeta_triton#2, triton#2" in text


def test_tokens_are_equal_a_near_tie_or_a_difference():
    top = [[[[1, -0.1], [9, -2.0]], [[2, -0.50], [7, -0.55]], [[3, -0.1], [8, -3.0]]]]
    a = _run({}, [[1, 2, 3]], top)
    assert BENCH["tokens_verdict"](a, _run({}, [[1, 2, 3]])) == "equal"
    assert BENCH["tokens_verdict"](a, _run({}, [[1, 7, 5]])) == "near-tie at prompt 0 token 1"
    assert BENCH["tokens_verdict"](a, _run({}, [[1, 2, 8]])) == "DIFFER at prompt 0 token 2"
    assert BENCH["tokens_verdict"](a, _run({}, [[9, 2, 3]])) == "DIFFER at prompt 0 token 0"


def test_the_plot_is_drawn(tmp_path):
    res = {"_machine": {"gpu": "test"},
           "1b/triton/decode": {k: _run({"1": 10.0, "8": 12.0}) for k in ("triton#1", "attnmeta_triton#1",
                                                                          "attnmeta_triton#2", "triton#2")}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(res))
    png = tmp_path / "p.png"
    assert BENCH["main"](["plot", str(path), "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_the_command_runs_as_a_user_types_it(tmp_path):
    import subprocess

    argv = ["plan", "--shapes", "1b", "--kinds", "flashinfer", "--topk", "4"]
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench_engine.py"), *argv], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "1b/flashinfer/eagle-topk4 attnmeta_flashinfer attention=attnmeta_flashinfer" in p.stdout


def test_a_run_discards_one_warm_up_engine_first_then_each_order_once_and_resumes(monkeypatch, tmp_path, capsys):
    """A fresh machine's first engine ran slower than the same engine later: a run starts one short engine and
    throws it away, then the four engines of each cell in order; a second run over the same file starts none."""
    import subprocess

    import torch

    started = []

    def fake(cmd, **kw):
        root, shape, backend, topk, tokens, reps = json.loads(cmd[-1])
        started.append((backend, tokens, reps))
        doc = _run({"1": 2.0 if backend.startswith("attnmeta") else 3.0})
        return subprocess.CompletedProcess(cmd, 0, stdout="log line\n" + json.dumps(doc) + "\n", stderr="")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a test GPU")
    monkeypatch.setattr(subprocess, "run", fake)
    out = tmp_path / "r.json"
    assert BENCH["main"](["run", "--shapes", "1b", "--kinds", "triton", "--topk", "0", "--json", str(out)]) == 0
    assert started == [("triton", 16, 1), ("triton", 128, 3), ("attnmeta_triton", 128, 3),
                       ("attnmeta_triton", 128, 3), ("triton", 128, 3)]
    saved = json.load(open(out))
    assert sorted(saved["1b/triton/decode"]) == ["attnmeta_triton#1", "attnmeta_triton#2", "triton#1", "triton#2"]
    assert "| 1b/triton/decode | 1 | 3.000 | 2.000 | 0.667" in capsys.readouterr().out
    started.clear()
    assert BENCH["main"](["run", "--shapes", "1b", "--kinds", "triton", "--topk", "0", "--json", str(out)]) == 0
    assert started == []  # all measured: no engine, not even the warm-up
    assert BENCH["main"](["run", "--shapes", "1b", "--kinds", "fa3", "--topk", "0", "--json", str(out),
                          "--no-warmup"]) == 0
    assert [b for b, *_ in started] == ["fa3", "attnmeta_fa3", "attnmeta_fa3", "fa3"]
