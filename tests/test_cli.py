"""The attnmeta command line, as a user runs it."""

import os
import subprocess
import sys

import pytest

from attnmeta.app.cli import main
from attnmeta.compiler import GENERIC_PASSES, PER_BS_PASSES
from attnmeta.compiler.ir import parse

PASSES = ["spec", *GENERIC_PASSES, *PER_BS_PASSES]
DUMPS = [f"{i:02d}-{p}" for i, p in enumerate(PASSES)]
SPECIALIZE = DUMPS[PASSES.index("specialize-batch")]


def test_compile_writes_ordered_dumps(tmp_path, capsys):
    assert main(["compile", "flashinfer", "--max-bs", "16", "--capture-sizes", "1", "8", "16",
                 "--dump-dir", str(tmp_path), "--dump-bs", "8"]) == 0
    out = capsys.readouterr().out
    assert "compiled flashinfer: 3 plans" in out and "bytes_per_step" in out
    mode = tmp_path / "flashinfer" / "latest" / "decode"  # the generic passes once, then bs8's own
    generic = sorted(f for f in os.listdir(mode) if f.endswith(".ir"))
    per_size = sorted(f for f in os.listdir(mode / "bs8") if f.endswith(".ir"))
    assert generic + per_size == [f"{x}.ir" for x in DUMPS]
    assert not (mode / "bs16").exists()  # only the selected size
    lowered = f"{len(DUMPS):02d}-lowered.py"
    assert lowered in os.listdir(mode / "bs8") and "graph.dot" in os.listdir(mode / "bs8")
    g = parse((mode / "bs8" / f"{SPECIALIZE}.ir").read_text())  # dumps parse back
    assert g.env["bs"] == 8
    assert "def in_graph" in (mode / "bs8" / lowered).read_text()


def test_inspect_lists_and_diffs(tmp_path, capsys):
    main(["compile", "flashinfer", "--max-bs", "4", "--capture-sizes", "2", "--dump-dir", str(tmp_path)])
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--diff"]) == 0
    out = capsys.readouterr().out
    assert "== decode, bs 2 ==" in out  # the largest captured size, dumped by default
    assert f"+++ {SPECIALIZE}.ir" in out and "-  %kv_indptr = cumsum(%seq_lens)" in out


def test_inspect_missing_dir(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "attnmeta compile BACKEND --dump-dir" in capsys.readouterr().err


def test_bad_options_are_one_line_errors(capsys):
    assert main(["compile", "flashinfer", "--max-bs", "4", "--capture-sizes", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnmeta: capture sizes [8] are outside 1..max_bs=4") and "Traceback" not in err


def test_compile_multistep_with_branches(tmp_path, capsys):
    assert main(["compile", "multistep_triton", "--max-bs", "4", "--capture-sizes", "4", "--topk", "2",
                 "--num-steps", "2", "--max-context-len", "64", "--dump-dir", str(tmp_path)]) == 0
    text = (tmp_path / "multistep_triton" / "latest" / "decode" / "bs4" / f"{SPECIALIZE}.ir").read_text()
    assert "%step1_kv_indptr = cumsum(%step1_seq_lens) {leading_zero=true} : i32[9]" in text  # 4 x 2 rows
    assert main(["compile", "multistep_triton", "--max-bs", "4", "--topk", "3", "--num-steps", "30",
                 "--max-context-len", "64"]) == 2
    assert "reads 90 request-table columns past each sequence" in capsys.readouterr().err


def test_a_backends_own_flags_reach_it_and_no_other(tmp_path, capsys):
    """--max-kv-splits is triton's own option: it reaches the plan (the host constant the kernel reads) and is
    refused for a backend whose options lack it, naming the flag and what that backend's options are."""
    assert main(["compile", "triton", "--max-bs", "4", "--capture-sizes", "4", "--max-context-len", "64",
                 "--max-kv-splits", "3", "--dump-dir", str(tmp_path)]) == 0
    text = (tmp_path / "triton" / "latest" / "decode" / "bs4" / f"{SPECIALIZE}.ir").read_text()
    assert "%max_kv_splits = full() {dtype=i32, placement=host, shape=[], value=3}" in text
    capsys.readouterr()
    assert main(["compile", "dsv4", "--max-bs", "4", "--max-kv-splits", "3"]) == 2
    err = capsys.readouterr().err
    assert "--max-kv-splits: not an option of backend 'dsv4'; its options (DSV4Options) are" in err
    assert main(["compile", "trtllm_mha", "--max-bs", "4", "--index-topk", "1024"]) == 2
    assert "it has no options of its own" in capsys.readouterr().err


def test_compile_dsv4_for_a_pool_with_one_ratio(capsys):
    """--compress-ratios reaches the spec: with c128 only, decode has no indexer schedule (one kernel)."""
    assert main(["compile", "dsv4", "--max-bs", "4", "--capture-sizes", "4", "--max-context-len", "512"]) == 0
    both = capsys.readouterr().out
    assert main(["compile", "dsv4", "--max-bs", "4", "--capture-sizes", "4", "--max-context-len", "512",
                 "--compress-ratios", "128"]) == 0
    one = capsys.readouterr().out
    rows = [next(r.split() for r in out.splitlines() if r.startswith("decode")) for out in (both, one)]
    assert [r[4] for r in rows] == ["2", "1"] and [r[5] for r in rows] == ["0", "0"]  # kernels, host ops


def test_dump_dir_from_environment(tmp_path):
    env = {**os.environ, "ATTNMETA_DUMP_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "attnmeta.app.cli", "compile", "flashinfer", "--max-bs", "2",
                        "--capture-sizes", "1"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    run = tmp_path / "flashinfer" / "latest"
    assert not (run / "idle").exists()  # IDLE shares DECODE's plan
    assert (run / "decode" / "bs1" / f"{DUMPS[-1]}.ir").exists()  # the largest captured size


def test_demo_short_run(capsys):
    assert main(["demo", "--steps", "12", "--max-bs", "12"]) == 0
    out = capsys.readouterr().out
    assert "metadata mismatches        0" in out and out.rstrip().endswith("OK")


@pytest.mark.parametrize("backend", ["flashattention", "triton", "tbo_flashinfer", "dsv4", "flashattention_draft",
                                     "flashinfer_mla"])
def test_demo_every_backend_matches_the_pool_oracle(backend):
    """Attention through each backend's metadata (page-table attention, the Triton split-KV kernel
    under the interpreter, TBO, DSV4's sparse SWA + compressed attention, the FlashAttention drafter's
    page tables) against attention computed straight from the pools."""
    from attnmeta.app.demo import run_demo

    r = run_demo(backend, steps=10, max_bs=12, capture_sizes=(1, 4, 8))
    assert r.mismatches == 0 and r.steps == 10
    assert r.max_abs_diff < 1e-5


@pytest.mark.parametrize("backend", ["flashmla", "trtllm_mla", "cutedsl_mla"])
def test_the_demo_names_why_it_cannot_serve_a_paged_only_backend(backend, capsys):
    """The demo's pool is token-granular; a backend that serves only larger pages is refused in one
    line that says how to compile it instead."""
    assert main(["demo", "--backend", backend, "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert f"{backend} serves pages of" in err and f"attnmeta compile {backend} --page-size" in err
    assert len(err.strip().splitlines()) == 1


def test_dsv4_attention_oracle_is_hand_checkable():
    """The DSV4 oracle attends to the SWA copies of the last 128 tokens and one compressed entry per
    full 128-token block: with one key per set made dominant, the output is that key's value."""
    import torch

    from attnmeta.sim.attention import dsv4_attention_from_pool

    row = torch.arange(300, dtype=torch.int32)  # token j in slot j: pages 0 and 1
    f2s = torch.arange(300, dtype=torch.int32)
    swa_k, swa_v = torch.zeros(300, 1, 1), torch.zeros(300, 1, 1)
    c_k, c_v = torch.zeros(4, 1, 1), torch.zeros(4, 1, 1)
    c_k[1] = 50.0  # block 1 of page 0 (tokens 128..255): entry 0 * 2 + 1
    c_v[1] = 7.0
    out = dsv4_attention_from_pool(torch.ones(1, 1, 1), swa_k, swa_v, c_k, c_v, row[None], f2s, torch.tensor([0]),
                                   torch.tensor([260]))
    assert abs(float(out) - 7.0) < 1e-4  # 260 tokens: 2 compressed blocks, the dominant one read


def test_mla_attention_oracle_is_hand_checkable():
    """MLA (one latent head): a query of zeros weighs every key alike, so the output is the mean of the
    keys' latents; a query whose rope part meets one key's rope strongly reads that key's latent; and
    the metadata-reading attention the demo captures agrees with the pool oracle."""
    import torch

    from attnmeta.sim.attention import mla_attention_from_pool, mla_decode_attention

    ckv, kpe = torch.tensor([[2.0], [4.0], [9.0]]), torch.tensor([[0.0], [0.0], [1.0]])  # C = R = 1
    row, rows, lens = torch.tensor([[1, 0, 2]], dtype=torch.int32), torch.tensor([0]), torch.tensor([2])
    out = mla_attention_from_pool(torch.zeros(1, 1, 2), ckv, kpe, row, rows, lens)
    assert out.shape == (1, 1, 1) and abs(float(out) - 3.0) < 1e-6  # slots 1 and 0: (4 + 2) / 2
    out = mla_attention_from_pool(torch.tensor([[[0.0, 80.0]]]), ckv, kpe, row, rows, torch.tensor([3]))
    assert abs(float(out) - 9.0) < 1e-4  # slot 2's rope dominates: its latent
    g = torch.Generator().manual_seed(0)
    ckv, kpe, q = torch.randn(20, 6, generator=g), torch.randn(20, 2, generator=g), torch.randn(3, 4, 8, generator=g)
    table = torch.randperm(20, generator=g).view(2, 10).int()
    rows, lens = torch.tensor([1, 0, 1]), torch.tensor([10, 3, 1])
    indptr = torch.tensor([0, 10, 13, 14])
    indices = torch.cat([table[r, :n] for r, n in zip(rows.tolist(), lens.tolist(), strict=True)])
    mine = mla_decode_attention(q, ckv, kpe, indptr, indices, max_len=10)
    assert torch.allclose(mine, mla_attention_from_pool(q, ckv, kpe, table, rows, lens), atol=1e-5)


def test_demo_runs_the_drafter_with_branches(capsys):
    """multistep_*: the DraftRunner over a pool that hands out each branch's draft slots every step."""
    assert main(["demo", "--backend", "multistep_triton", "--topk", "2", "--num-steps", "2", "--steps", "8",
                 "--max-bs", "8", "--capture-sizes", "2", "4"]) == 0
    out = capsys.readouterr().out
    assert "metadata mismatches        0" in out and "graph replays" in out and out.rstrip().endswith("OK")


def test_force_disables_a_safety_pass(capsys):
    assert main(["compile", "triton", "--max-bs", "4", "--capture-sizes", "4", "--disable-pass", "check-split",
                 "--force"]) == 0


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")
def test_demo_on_cuda_without_cuda(capsys):
    assert main(["demo", "--device", "cuda", "--steps", "2"]) == 2
    assert "this machine has no CUDA device" in capsys.readouterr().err


def test_bench_names_the_planner_it_measured(capsys):
    """A stand-in planner is never measured silently: the table's title says which planner ran."""
    assert main(["bench", "--backend", "flashinfer", "--sizes", "1", "2", "--iters", "5", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "planner: STAND-IN" in out and "| 2 |" in out
    assert main(["bench", "--backend", "triton", "--sizes", "1", "--iters", "5", "--device", "cpu"]) == 0
    assert "planner: none" in capsys.readouterr().out
    assert main(["bench", "--backend", "flashinfer", "--planner", "flashinfer", "--device", "cpu"]) == 2
    assert "--planner flashinfer needs a CUDA device" in capsys.readouterr().err


def test_bench_json_carries_every_column_and_the_planner(capsys):
    import json

    assert main(["bench", "--backend", "flashinfer", "--sizes", "1", "3", "--iters", "5", "--device", "cpu",
                 "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # the whole of stdout parses: notes go to stderr
    assert "note: on a CPU" in captured.err
    assert doc["planner"] == "stand-in" and "STAND-IN" in doc["planner_label"] and doc["device"] == "cpu"
    assert [r["bs"] for r in doc["rows"]] == [1, 3]
    for r in doc["rows"]:
        assert r["compiled_us"] > 0 and r["floor_us"] > 0 and r["staged_bytes"] > 0
        assert r["gpu_us"] is None  # no device time on a CPU, never a made-up number


def test_bench_e2e_needs_a_real_kernel_and_a_gpu(capsys):
    assert main(["bench", "--backend", "flashattention", "--e2e-layers", "4", "--device", "cpu"]) == 2
    assert "with page size 1 has no real attention kernel here" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert main(["bench", "--backend", "triton", "--e2e-layers", "4", "--device", "cpu"]) == 2
        assert "it needs a CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["target_verify", "draft_extend"])
def test_bench_measures_the_speculative_modes(capsys, mode):
    """Every benched backend in target verify and draft extend, side by side with its eager twin (and,
    for flashinfer, the prefill planner: the labelled stand-in on a CPU)."""
    import json

    for backend in ("flashinfer", "triton", "flashattention", "dsv4", "flashmla", "trtllm_mla"):
        assert main(["bench", "--backend", backend, "--mode", mode, "--sizes", "1", "4", "--iters", "5",
                     "--device", "cpu", "--json"]) == 0
        out = capsys.readouterr().out
        doc = json.loads(out[out.index("{"):])
        assert doc["mode"] == mode and [r["bs"] for r in doc["rows"]] == [1, 4]
        assert all(r["compiled_us"] > 0 and r["eager_us"] > 0 for r in doc["rows"])
        assert ("STAND-IN" in doc["planner_label"]) == (backend == "flashinfer")


@pytest.mark.parametrize("backend", ["tbo_flashinfer", "tbo_triton", "multistep_flashinfer", "multistep_triton",
                                     "dsv4", "flashmla", "trtllm_mla"])
def test_bench_measures_the_wrapped_backends(capsys, backend):
    """Two-batch overlap (the eager side builds the batch and both halves, each planned), the multi-step
    drafter (one eager backend and one plan per draft step) and the paged-only MLA kinds (FlashMLA's
    64-token pages and its scheduler, TRT-LLM MLA's pages) are benched like the others."""
    import json

    assert main(["bench", "--backend", backend, "--sizes", "2", "4", "--iters", "5", "--device", "cpu", "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out[out.index("{"):])
    assert [r["bs"] for r in doc["rows"]] == [2, 4] and all(r["eager_us"] > 0 for r in doc["rows"])
    assert doc["planner"] == ("stand-in" if backend.endswith("flashinfer") else "none")


@pytest.mark.parametrize(("args", "says"), [
    (["--iters", "0"], "argument --iters: must be at least 1, got 0"),
    (["--sizes", "-1"], "argument --sizes: must be at least 1, got -1"),
    (["--e2e-layers", "-1"], "argument --e2e-layers: must be at least 1, got -1"),  # ran the plain bench
    (["--e2e-layers", "0"], "argument --e2e-layers: must be at least 1, got 0"),
])
def test_bench_counts_below_one_are_one_line_naming_the_flag(capsys, args, says):
    """Was a StatisticsError traceback (--iters 0), an error about max_bs (--sizes -1), or the plain bench run
    as if the flag were absent (--e2e-layers 0 or -1)."""
    with pytest.raises(SystemExit) as e:
        main(["bench", "--backend", "triton", "--device", "cpu", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err and len(err.strip().splitlines()) == 1


def test_another_commands_option_is_named_as_such_not_suggested_as_itself(capsys):
    """``compile --bs 8`` answered "did you mean '--bs'?": --bs belongs to inspect."""
    with pytest.raises(SystemExit) as e:
        main(["compile", "triton", "--bs", "8"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--bs is an option of attnmeta inspect, not of attnmeta compile; did you mean '--max-bs'?" in err
    assert "mean '--bs'" not in err


def test_a_dump_size_not_compiled_names_the_capture_sizes_flag(capsys):
    assert main(["compile", "triton", "--max-bs", "8", "--dump-bs", "999"]) == 2
    err = capsys.readouterr().err
    assert "(--capture-sizes)" in err and "(--sizes)" not in err


@pytest.mark.parametrize(("args", "says"), [
    (["--mode", "target_verify"], "--mode target_verify: this run recorded none; it has ['decode']"),
    (["--pass", "lower", "--diff"], "--pass lower --diff: lower writes code, not IR"),
])
def test_inspect_filters_that_match_nothing_are_refused_with_the_choices(tmp_path, capsys, args, says):
    """Were an empty table (or no diff) and exit 0."""
    assert main(["compile", "triton", "--max-bs", "4", "--dump-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "triton"), *args]) == 2
    assert says in capsys.readouterr().err


def test_dump_modes_not_compiled_are_refused_with_the_choices(tmp_path, capsys):
    assert main(["compile", "triton", "--max-bs", "4", "--dump-dir", str(tmp_path), "--dump-modes",
                 "target_verify"]) == 2
    assert "dump_modes ['target_verify'] are not compiled graphs (--dump-modes): the compile has ['decode']" in \
        capsys.readouterr().err


@pytest.mark.parametrize(("backend", "page"), [("flashmla", 64), ("trtllm_mla", 32)])
def test_a_backend_that_does_not_serve_pages_of_one_compiles_at_a_size_it_serves(capsys, backend, page):
    """Was a refusal of the default page size."""
    assert main(["compile", backend, "--max-bs", "4"]) == 0
    err = capsys.readouterr().err
    assert f"compiling at {page} (--page-size)" in err
    assert main(["compile", backend, "--max-bs", "4", "--page-size", "1"]) == 2  # named, it is still checked


def test_print_before_lower_prints_what_lowering_reads(capsys):
    """lower is a pass in the pass table and in inspect; --print-before refused it."""
    assert main(["compile", "triton", "--max-bs", "4", "--print-before", "lower"]) == 0
    err = capsys.readouterr().err
    assert "IR Dump Before lower" in err and "bs=4" in err


@pytest.mark.parametrize(("body", "says"), [
    ("def build(:\n", r"bad\.py:1: a syntax error in the spec's code"),
    ("import os\nraise RuntimeError('boom')\n", r"bad\.py:2: importing .* raised RuntimeError: boom"),
    ("from attnmeta.compiler import BackendSpec, ForwardMode\n\ndef build(mode, options):\n"
     "    raise ValueError('my builder is broken')\n\nSPEC = BackendSpec('bad', build, (ForwardMode.DECODE,))\n",
     r"bad\.py:4: the builder of spec 'bad' \(decode\) raised ValueError: my builder is broken"),
])
def test_a_spec_file_that_fails_is_one_line_naming_its_file_and_line(tmp_path, capsys, body, says):
    """Were 19-29 lines of traceback through attnmeta's code, exit 1."""
    import re

    f = tmp_path / "bad.py"
    f.write_text(body)
    assert main(["compile", f"{f}:SPEC", "--max-bs", "2"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(says, err), err


def test_inspect_lists_runs_and_keeps_the_newest(tmp_path, capsys):
    for _ in range(3):
        assert main(["compile", "triton", "--max-bs", "2", "--dump-dir", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "triton"), "--runs"]) == 0
    out = capsys.readouterr().out
    runs = sorted(d.name for d in (tmp_path / "triton").iterdir() if d.name.startswith("run-"))
    assert len(runs) == 3 and all(r in out for r in runs) and out.count("complete") == 3
    assert main(["inspect", str(tmp_path / "triton"), "--keep", "1"]) == 0
    assert sorted(d.name for d in (tmp_path / "triton").iterdir() if d.name.startswith("run-")) == runs[-1:]
    assert main(["inspect", str(tmp_path / "triton")]) == 0  # latest still resolves


def test_the_names_the_command_line_offers_are_the_compilers():
    """--help and inspect answer before the compiler loads, from app/names.py: the same passes, in pipeline
    order, and the same built-in backends as the compiler's registry."""
    from attnmeta.app.names import BACKENDS, PASSES
    from attnmeta.backends import SPECS

    assert PASSES == [*GENERIC_PASSES, *PER_BS_PASSES]
    assert BACKENDS == sorted(SPECS)


def _imports_torch(argv: list[str]) -> bool:
    """Whether running ``attnmeta ARGV`` in a fresh interpreter imported torch."""
    code = ("import sys\nfrom attnmeta.app.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
            "    pass\nprint('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout.strip().splitlines()[-1] == "True"


def test_help_and_inspect_never_load_torch(tmp_path):
    """The commands a newcomer runs first answer at once: --help of every command, and reading a run's dumps
    (its pass table and diffs), load no torch (seconds on a small machine); compiling does."""
    for argv in (["--help"], ["compile", "--help"], ["inspect", "--help"], ["demo", "--help"], ["bench", "--help"]):
        assert not _imports_torch(argv), argv
    main(["compile", "triton", "--max-bs", "4", "--dump-dir", str(tmp_path)])
    assert not _imports_torch(["inspect", str(tmp_path)])
    assert not _imports_torch(["inspect", str(tmp_path), "--diff", "--mode", "decode"])
    assert _imports_torch(["compile", "triton", "--max-bs", "2"])  # the check can fail: compiling loads it
