"""tools/bench_sglang.py, the benchmark against SGLang's own backends, smoke-run on a CPU (emulated graphs,
SGLang's Triton kernels in the interpreter; its times mean nothing here): it builds both sides from
SGLang's flags, times every mode, and its equality check passes on equal metadata and fails on a
difference."""

import importlib.util
import json
import os

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sglang", os.path.join(ROOT, "tools", "bench_sglang.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_mode_is_timed_and_equal(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "bench.json"
    rc = bench.main(["--device", "cpu", "--kinds", "triton", "--pages", "1", "--sizes", "1,8", "--eagle-sizes", "8",
                     "--iters", "3", "--json", str(out)])
    rows = json.loads(out.read_text())
    assert rc == 0
    assert [(r["mode"], r["bs"]) for r in rows] == [("decode", 1), ("decode", 8), ("verify", 8), ("extend", 8)]
    assert all(r["equal"] == r["steps"] == 3 and r["sglang_us"] > 0 and r["attnmeta_us"] > 0 and r["floor2_us"] > 0
               for r in rows)


def test_a_difference_fails_the_run(bench, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    read = bench.Side.read

    def off_by_one(self, prep):
        got = read(self, prep)
        if self.name == "attnmeta":
            got["kv_indices"] = got["kv_indices"] + 1
        return got

    monkeypatch.setattr(bench.Side, "read", off_by_one)
    assert bench.main(["--device", "cpu", "--kinds", "triton", "--pages", "1", "--sizes", "8", "--eagle-sizes", "",
                       "--iters", "2"]) == 1
