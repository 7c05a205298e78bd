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


def test_fa3_tree_verify_is_compared_with_its_expansion(bench, tmp_path, monkeypatch):
    """fa3 under EAGLE's defaults (topk 4): the verify's comparison includes the tree's expansion (each draft
    query's visible drafts), and a slot off by one in it fails the run."""
    from tests import fake_fa3

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    fake_fa3.into_sglang(monkeypatch)
    read, seen = bench.Side.read, []

    def spy(self, prep):
        got = read(self, prep)
        seen.append(sorted(got))
        return got

    monkeypatch.setattr(bench.Side, "read", spy)
    args = ["--device", "cpu", "--kinds", "fa3-tree", "--pages", "16", "--sizes", "8", "--eagle-sizes", "8",
            "--eagle-pages", "16", "--iters", "2"]
    assert bench.main(args) == 0
    assert any("expand_slots" in fields for fields in seen)

    def off_by_one(self, prep):
        got = read(self, prep)
        if self.name == "attnmeta" and "expand_slots" in got:
            got["expand_slots"] = got["expand_slots"] + 1
        return got

    monkeypatch.setattr(bench.Side, "read", off_by_one)
    assert bench.main(args) == 1


def test_pin_runs_the_process_on_one_allowed_cpu(bench):
    allowed = os.sched_getaffinity(0)
    try:
        said = bench.pin("auto")  # no GPU here: the first CPU this process may use
        assert os.sched_getaffinity(0) == {min(allowed)} and said == f"pinned to CPU {min(allowed)} of {len(allowed)}"
        with pytest.raises(SystemExit, match="may run on CPUs"):
            bench.pin(str(max(allowed) + 1000))
    finally:
        os.sched_setaffinity(0, allowed)
