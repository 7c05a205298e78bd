"""The examples/ directory runs as its docstrings say, so it never rots: the new backend compiles
to one kernel, its broken twin gets the check-split report its comments promise, and the serving
loop embeds it."""

import os

import pytest

from attnmeta.app.cli import main
from attnmeta.compiler import CompileOptions, SplitError, compile_backend

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EX = os.path.join(ROOT, "examples")


def test_the_new_backend_compiles_to_one_kernel(capsys):
    assert main(["compile", os.path.join(EX, "mine.py") + ":SPEC", "--max-bs", "64", "--page-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "compiled mine: 12 plans" in out
    cb = compile_backend(os.path.join(EX, "mine.py") + ":SPEC", CompileOptions(max_bs=8, page_size=16))
    row = cb.summary()[0]
    assert row["kernels"] == "1" and row["host_ops"] == 1  # the planner's host indptr, nothing else


def test_the_broken_backend_gets_every_violation_with_its_line():
    with pytest.raises(SplitError) as e:
        compile_backend(os.path.join(EX, "mine_broken.py") + ":SPEC", CompileOptions(max_bs=8, page_size=16))
    lines = open(os.path.join(EX, "mine_broken.py")).read().splitlines()
    got = {(v.rule, lines[int(v.origin.rsplit(":", 1)[1]) - 1].strip()[:30]) for v in e.value.violations}
    assert got == {("host-value-in-graph", 'cu_seqlens_k = b.ewise("add", '),
                   ("missing-fill-value", 'rows = b.input("req_pool_indic')}
    assert all(v.fix for v in e.value.violations)


def test_the_serving_loop_runs(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("serve_example", os.path.join(EX, "serve.py"))
    serve = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve)
    assert serve.main(["--steps", "15", "--device", "cpu"]) == 0
    assert "served 15 steps of mine on cpu: every page table checked" in capsys.readouterr().out
