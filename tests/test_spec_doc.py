"""docs/SPEC.md stays true: every public SpecBuilder method has a docstring and a row in the page, and the
worked example (the page's code, run as written) compiles, serves a batch whose page table and indptrs are
checked by hand, and its two commands run."""

import inspect
import os
import re

import torch

from attnmeta.app.cli import main
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import SpecBuilder
from attnmeta.runtime import ForwardBatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = open(os.path.join(ROOT, "docs", "SPEC.md")).read()


def test_every_builder_method_has_a_docstring_and_a_place_in_the_page():
    methods = [n for n, f in vars(SpecBuilder).items() if not n.startswith("_") and inspect.isfunction(f)]
    assert [n for n in methods if not getattr(SpecBuilder, n).__doc__] == []
    assert [n for n in methods if f"{n}(" not in PAGE and n not in ("in_graph", "out_graph")] == []


def test_the_worked_example_compiles_and_serves_as_written(tmp_path, capsys):
    code = re.search(r"```python\n(.*?)```", PAGE, re.S).group(1)
    ns: dict = {}
    exec(compile(code, "docs/SPEC.md", "exec"), ns)  # noqa: S102
    P, L = 4, 32
    pool = torch.arange(8 * L, dtype=torch.int32).view(8, L)  # row r, column c: slot r * L + c
    be = compile_backend(ns["SPEC"], CompileOptions(max_bs=4, capture_sizes=(4,), page_size=P,
                                                    max_context_len=L)).instantiate(pool)
    seq = torch.tensor([5, 9], dtype=torch.int32)
    rows = torch.tensor([2, 3])
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 2, req_pool_indices=rows, req_pool_indices_cpu=rows,
                                          seq_lens=seq, seq_lens_cpu=seq))
    m = be.forward_metadata
    # by hand: row r's page j is slot (r * L + j * P) // P
    assert m.page_table[0, :2].tolist() == [2 * L // P, 2 * L // P + 1]
    assert m.page_table[1, :3].tolist() == [3 * L // P, 3 * L // P + 1, 3 * L // P + 2]
    assert m.cu_seqlens_k[:3].tolist() == [0, 5, 14] and m.kv_indptr_host[:3].tolist() == [0, 5, 14]
    for cmd in re.search(r"```sh\n(.*?)```", PAGE, re.S).group(1).strip().splitlines():
        args = cmd.split()[1:]
        args = [str(tmp_path / "dumps") if a == "dumps" else str(tmp_path / "dumps" / "mine") if a == "dumps/mine"
                else os.path.join(ROOT, a) if a.startswith("examples/") else a for a in args]
        assert main(args) == 0, cmd
    assert "pass" in capsys.readouterr().out
