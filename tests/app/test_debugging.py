"""Debugging that scales: dumps once per mode plus the selected sizes, a run folder per compile,
the pass table, filtered printing, the IR a failing pass got, logs, and no change to the host
process's environment on import."""

import io
import json
import logging
import os
import subprocess
import sys

import pytest

from attnmeta.app.cli import main
from attnmeta.backends import get_spec, list_backends
from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.compiler.instruments import PrintIR

GENERIC, PER_SIZE = 10, 5  # spec + 9 generic passes; 3 per-size passes + lowered.py + graph.dot


def _files(d) -> list[str]:
    return [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]


@pytest.mark.parametrize("backend", list_backends())
@pytest.mark.parametrize("dump_bs", [(), (2, 4)], ids=["default", "two-sizes"])
def test_dump_files_scale_with_modes_and_selected_sizes(backend, dump_bs, tmp_path):
    modes = [m.name.lower() for m in get_spec(backend).modes if m.name != "EXTEND"]
    opts = CompileOptions(max_bs=8, capture_sizes=(1, 2, 4, 8), max_context_len=600, modes=modes,
                          dump_dir=str(tmp_path), dump_bs=dump_bs, page_size=(get_spec(backend).page_sizes or (1,))[0])
    cb = compile_backend(backend, opts)
    run = os.path.realpath(tmp_path / backend / "latest")
    sizes = len(dump_bs) or 1  # the default: the largest captured size
    n_modes = len(cb.generic)
    assert len(_files(run)) == n_modes * (GENERIC + sizes * PER_SIZE) + 1  # + passes.json
    table = json.load(open(os.path.join(run, "passes.json")))
    assert table["backend"] == backend and {r["mode"] for r in table["passes"]} == {m.name.lower() for m in cb.generic}


def test_each_compile_gets_a_run_folder_and_latest_follows(tmp_path):
    opts = CompileOptions(max_bs=4, capture_sizes=(4,), dump_dir=str(tmp_path))
    compile_backend("triton", opts)
    first = os.path.realpath(tmp_path / "triton" / "latest")
    compile_backend("triton", opts)
    second = os.path.realpath(tmp_path / "triton" / "latest")
    assert first != second and os.path.exists(first)  # a rerun keeps the last run
    with open(os.path.join(second, "decode", "00-spec.ir")) as f:
        assert f.readline().startswith("// -----// IR Dump After spec (decode) //----- //")


def test_print_after_and_before_one_pass_for_the_selected_size(capsys):
    out = io.StringIO()
    from attnmeta.compiler.dumps import Selection

    compile_backend("triton", CompileOptions(max_bs=8, capture_sizes=(2, 8)),
                    instruments=[PrintIR(out, after={"fuse"}, before={"check-split"}, select=Selection((), (8,)))])
    text = out.getvalue()
    assert text.count("IR Dump After fuse (decode, bs=8)") == 1 and "bs=2" not in text
    assert text.count("IR Dump Before check-split (decode, bs=8)") == 1
    assert text.count("// -----//") == 2


def test_the_ir_a_failing_pass_got_is_printed(capsys):
    from attnmeta.compiler import BackendSpec, ForwardMode, SplitError
    from attnmeta.compiler.ir import DType, Placement, SpecBuilder

    def build(mode, options):
        b = SpecBuilder("bad")
        cpu = b.input("seq_lens_cpu", DType.int32, ["bs"], Placement.host, fill=1)
        with b.in_graph():
            b.outputs(x=b.cumsum(cpu))
        return b.build()

    out = io.StringIO()
    with pytest.raises(SplitError):
        compile_backend(BackendSpec("bad", build, (ForwardMode.DECODE,)), CompileOptions(max_bs=2),
                        instruments=[PrintIR(out, after=set(), on_failure=True)])
    assert "IR Dump Before failed check-split (decode, bs=2)" in out.getvalue()


def test_inspect_prints_the_pass_table_then_diffs_for_one_size(tmp_path, capsys):
    assert main(["compile", "triton", "--max-bs", "8", "--capture-sizes", "4", "8", "--dump-dir", str(tmp_path),
                 "--dump-bs", "4", "8"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["pass", "mode", "bs", "changed", "nodes", "ms", "kernels"]
    assert "fuse" in out and "lower" in out
    assert main(["inspect", str(tmp_path), "--diff", "--mode", "decode", "--bs", "4", "--pass", "fuse"]) == 0
    out = capsys.readouterr().out
    assert "kernel=k0" in out and out.count("+++") == 1  # the one pass asked for
    assert main(["inspect", str(tmp_path), "--diff", "--bs", "3"]) == 2
    assert "sizes dumped: [4, 8]" in capsys.readouterr().err


def test_logs_name_every_runtime_event(caplog):
    import torch

    from attnmeta.compiler import logs  # noqa: F401
    from attnmeta.runtime import BatchError, ForwardBatch, ForwardMode
    from attnmeta.sim import DecodeModel, GraphRunner
    from tests.batches import make_batch, make_pool

    del logs
    with caplog.at_level(logging.DEBUG, logger="attnmeta"):
        cb = compile_backend("flashinfer", CompileOptions(max_bs=8, capture_sizes=(2, 4), max_context_len=32))
        be = cb.instantiate(make_pool(12, 32))
        k = torch.randn(12 * 32 + 1, 2, 8)
        r = GraphRunner(be, DecodeModel(k, k, 8, 32), (2, 4), "cpu")
        r.capture()
        r.run(make_batch(3, 32, 12, seed=0), torch.randn(3, 2, 8))  # padded to 4
        r.run(make_batch(6, 32, 12, seed=1), torch.randn(6, 2, 8))  # eager: past 4, no plan ahead at 6
        fb = make_batch(2, 32, 12, seed=2)
        fb.seq_lens_cpu[0] = 99
        with pytest.raises(BatchError):
            be.init_forward_metadata(fb)
    text = caplog.text
    for event in ("compiled flashinfer", "bound plan flashinfer.decode.bs4", "padded to the captured size 4",
                  "runs eagerly", "no plan compiled ahead, compiling it", "refused a decode batch"):
        assert event in text, event
    del ForwardBatch, ForwardMode


def test_attnmeta_logs_switches_parts_on_like_torch_logs():
    code = ("from attnmeta.compiler import CompileOptions, compile_backend; "
            "compile_backend('triton', CompileOptions(max_bs=2, capture_sizes=(2,)))")
    env = {**os.environ, "ATTNMETA_LOGS": "compile"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "[attnmeta.compile] compiled triton: 1 plans" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ATTNMETA_LOGS": ""})
    assert "attnmeta.compile" not in r.stderr  # off unless asked
    from attnmeta.compiler import logs

    with pytest.raises(ValueError, match="unknown part 'runtim' \\(did you mean 'runtime'\\?\\)"):
        logs.configure("runtim")
    # a typo in the variable is one line on stderr, never a failed import
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ATTNMETA_LOGS": "runtim,compile"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "attnmeta: ATTNMETA_LOGS: unknown part 'runtim' (did you mean 'runtime'?)" in r.stderr
    assert "[attnmeta.compile] compiled triton" in r.stderr  # the parts it knows are on


def test_a_dump_size_that_is_not_compiled_is_named(tmp_path, capsys):
    from attnmeta.compiler import OptionsError

    with pytest.raises(OptionsError, match=r"dump_bs \[999\] are not compiled sizes \(compiled: \[1, 2\]\)"):
        compile_backend("triton", CompileOptions(max_bs=2, capture_sizes=(1, 2), dump_dir=str(tmp_path),
                                                 dump_bs=(999,)))
    assert main(["compile", "triton", "--max-bs", "2", "--capture-sizes", "1", "2", "--dump-dir", str(tmp_path),
                 "--dump-bs", "999"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_importing_attnmeta_changes_nothing_in_the_environment():
    code = ("import os, json; before = dict(os.environ); "
            "import attnmeta.compiler, attnmeta.runtime, attnmeta.backends, attnmeta.app.cli; "
            "print(json.dumps(dict(os.environ) == before))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.stdout.strip() == "true", r.stderr


def test_cli_version_and_help_with_defaults_and_examples(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.startswith("attnmeta 0.")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "examples:" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    out = capsys.readouterr().out
    assert "(default: 256)" in out and "--dump-bs" in out and "--print-before" in out


@pytest.mark.parametrize(("argv", "hint"), [
    (["compil", "triton"], "did you mean 'compile'?"),
    (["compile", "triton", "--modes", "decod"], "did you mean 'decode'?"),
    (["compile", "triton", "--dump-bss", "8"], "did you mean '--dump-bs'?"),
    (["compile", "tritn"], "did you mean 'triton'?"),
    (["compile", "triton", "--disable-pass", "fus"], "did you mean 'fuse'?"),
])
def test_a_mistyped_command_line_is_one_line_with_a_suggestion(argv, hint, capsys):
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and hint in err and "usage:" not in err


def test_a_spec_file_named_without_its_spec_gets_the_names_in_it(capsys):
    ex = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "mine.py")
    assert main(["compile", ex]) == 2
    assert f"name the spec in it, e.g. {ex}:SPEC (its BackendSpecs: SPEC)" in capsys.readouterr().err
    assert main(["compile", ex + ":SPECC"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"did you mean {ex}:SPEC?" in err
