"""Goldens for what lowering emits: the fx code of each module, the Triton source of each fused
kernel, and the binding, for one plan per backend family. A codegen change is a diff in
tests/lowering/golden/, reviewed like code: regenerate with ATTNMETA_ACCEPT=1 and read the diff."""

import os
import pathlib

import pytest

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend

GOLDEN = pathlib.Path(__file__).parent / "golden"
CASES = {  # name: (backend, mode, bs, options)
    "flashinfer-decode": ("flashinfer", ForwardMode.DECODE, 4, {}),
    "triton-verify": ("triton", ForwardMode.TARGET_VERIFY, 4, {"modes": ("target_verify",)}),
    "flashattention-p16": ("flashattention", ForwardMode.DECODE, 2, {"page_size": 16}),
    "dsv4-decode": ("dsv4", ForwardMode.DECODE, 2, {"max_context_len": 512}),
    "tbo-triton": ("tbo_triton", ForwardMode.DECODE, 3, {}),
}


def lowered(name: str) -> str:
    backend, mode, bs, kw = CASES[name]
    opts = CompileOptions(**{"max_bs": 4, "capture_sizes": (bs,), "max_context_len": 64, **kw})
    plan = compile_backend(backend, opts).plan(mode, bs)
    return f"{plan.code()}\n# binding\n{plan.binding.describe()}"


@pytest.mark.parametrize("name", list(CASES))
def test_lowered_output_is_the_reviewed_one(name):
    path = GOLDEN / f"{name}.txt"
    text = lowered(name)
    if os.environ.get("ATTNMETA_ACCEPT") == "1" or not path.exists():
        path.write_text(text)
        if os.environ.get("ATTNMETA_ACCEPT") != "1":
            pytest.fail(f"no golden for {name}: wrote {path}; read it, then commit it")
    assert text == path.read_text(), f"lowering of {name} changed: diff {path} (ATTNMETA_ACCEPT=1 to accept)"


@pytest.mark.parametrize("backend", ["flashinfer", "triton", "flashattention", "dsv4", "tbo_triton",
                                     "tbo_flashinfer", "multistep_triton", "flashattention_draft"])
def test_sizes_sharing_a_skeleton_lower_as_they_would_alone(backend):
    """Sizes of a mode share one lowering skeleton (modules, kernels, argument kinds); each plan must
    be exactly what lowering its graph from scratch gives: same code, same binding."""
    from attnmeta.backends import get_spec
    from attnmeta.compiler.lowering import fx

    modes = tuple(m.name.lower() for m in get_spec(backend).modes if m is not ForwardMode.EXTEND)
    cb = compile_backend(backend, CompileOptions(max_bs=9, capture_sizes=(1, 2, 3, 8), modes=modes,
                                                 max_context_len=600 if backend == "dsv4" else 64))
    for (mode, bs), plan in cb.plans.items():
        fx._SKELETONS.clear()
        alone = fx.lower(plan.graph, mode, cb.stable[mode], cb.layout.base(mode), cb.options.max_bs)
        assert alone.code() == plan.code(), (mode, bs)
        assert alone.binding == plan.binding, (mode, bs)


@pytest.mark.parametrize("backend", ["flashinfer", "triton", "dsv4", "tbo_triton", "multistep_flashinfer",
                                     "flashattention_draft"])
def test_the_dumped_lowered_file_runs_on_its_own_and_computes_the_plan(backend, tmp_path):
    """NN-lowered.py: run as a script in a fresh process, and its main()'s fields equal the reference
    interpreter on the inputs main() made."""
    import runpy
    import subprocess
    import sys

    import torch

    from attnmeta.compiler.ir import eval_graph

    cb = compile_backend(backend, CompileOptions(max_bs=8, capture_sizes=(3, 8), max_context_len=600,
                                                 dump_dir=str(tmp_path)))
    run = tmp_path / backend / "latest"
    (script,) = sorted((run / "decode" / "bs8").glob("*-lowered.py"))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("\n") == len(cb.plan(ForwardMode.DECODE, 8).binding.fields)  # one line per field
    inputs, fields = runpy.run_path(str(script))["main"]()
    for name, t in inputs.items():  # a host mirror holds the same sample batch as its device field
        if name.endswith("_cpu") and name[:-4] in inputs:
            assert torch.equal(t.cpu().long(), inputs[name[:-4]].cpu().long()), name
    if "kv_indptr_host" in fields:
        assert torch.equal(fields["kv_indptr_host"].cpu(), fields["kv_indptr"].cpu())
    plan = cb.plan(ForwardMode.DECODE, 8)
    want = eval_graph(plan.graph, inputs)
    ragged = {o.field: o.ragged_by for o in plan.graph.outputs}
    for field, w in want.items():
        if isinstance(w, torch.Tensor) and field in fields:
            got = fields[field].cpu().reshape(w.shape) if fields[field].numel() == w.numel() else fields[field].cpu()
            if ragged.get(field):
                n = int(want[ragged[field]][-1])
                got, w = got[:n], w[:n]
            assert torch.equal(got, w), field


def test_the_lowering_memos_are_bounded():
    """A memo keeps at most its size, dropping the least recently used entry (a long-lived server
    compiling many specs must not grow without end); an entry dropped is made again when asked."""
    from attnmeta.compiler.lowering.memo import Memo

    made = []
    m = Memo("test", 2)

    def get(k):
        return m.get(k, lambda: made.append(k) or k * 10)

    assert [get(1), get(2), get(1), get(3)] == [10, 20, 10, 30]  # 3 drops 2, the least recently used
    assert len(m) == 2 and made == [1, 2, 3]
    assert get(1) == 10 and made == [1, 2, 3]  # still there
    assert get(2) == 20 and made == [1, 2, 3, 2]  # made again
