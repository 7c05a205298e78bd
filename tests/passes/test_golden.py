"""Golden per-pass tests: tests/passes/golden/<pass-name>*.ir holds a RUN
line naming the pass (and bindings), CHECK lines, and the input graph.
The pass output is matched with FileCheck (the PyPI ``filecheck``)."""

import pathlib
import re
import subprocess
import sys

import pytest

from attnmeta.compiler import CompileOptions, ForwardMode
from attnmeta.compiler.ir import parse, print_graph, verify
from attnmeta.compiler.passes.registry import PassContext
from attnmeta.compiler.pipeline import run_passes

GOLDEN = sorted((pathlib.Path(__file__).parent / "golden").glob("*.ir"))
DIRECTIVE = re.compile(r"//\s*(CHECK[\w-]*)(:?)")


def run_golden(path: pathlib.Path) -> str:
    lines = path.read_text().splitlines()
    run = next(ln for ln in lines if ln.startswith("// RUN:")).split()[2:]
    name, binds = run[0], dict(kv.split("=") for kv in run[1:])
    bs = int(binds.pop("bs")) if "bs" in binds else None
    opts = CompileOptions(max_bs=int(binds.get("max_bs", 256)), max_context_len=int(binds.get("L", 4096)))
    g = verify(parse("\n".join(ln for ln in lines if not ln.startswith("//"))))
    return print_graph(run_passes(g, [name], PassContext(opts, ForwardMode.DECODE, bs)))


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_golden(path):
    out = run_golden(path)
    r = subprocess.run([sys.executable, "-m", "filecheck", str(path)], input=out, text=True, capture_output=True)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n--- pass output ---\n{out}"


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_every_check_directive_has_its_colon(path):
    for ln in path.read_text().splitlines():
        m = DIRECTIVE.match(ln)
        if m:
            assert m.group(2) == ":", f"{path.name}: directive without colon is silently ignored: {ln!r}"


def test_every_pass_has_a_golden():
    from attnmeta.compiler.pipeline import GENERIC_PASSES, PER_BS_PASSES

    have = {p.stem.split(".")[0] for p in GOLDEN}
    missing = set(GENERIC_PASSES + PER_BS_PASSES) - have - {"verify", "check-split"}  # tested by their own files
    assert not missing, f"passes without a golden test: {missing}"
