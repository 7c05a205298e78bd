"""Instruments around the pipeline: repro bundles, disabling a pass, printing, timing."""

import io
import json
import os
import runpy

import attrs
import pytest

from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.compiler import CompileOptions, ForwardMode, PassError, SplitError, compile_backend
from attnmeta.compiler.instruments import PrintAfterAll
from attnmeta.compiler.passes.registry import PASSES, register_pass
from attnmeta.compiler.pipeline import PER_BS_PASSES


def test_crashing_pass_writes_a_repro_bundle_that_reruns(tmp_path, monkeypatch):
    @register_pass("explode-test")
    def explode(g, ctx):
        """Crashes on purpose."""
        raise ZeroDivisionError("boom")

    try:
        monkeypatch.setattr("attnmeta.compiler.pipeline.PER_BS_PASSES", (*PER_BS_PASSES[:1], "explode-test"))
        opts = CompileOptions(max_bs=4, capture_sizes=(2,), dump_dir=str(tmp_path),
                              backend=FlashInferOptions(plan_on_device=True), num_heads=16, num_kv_heads=4,
                              sm_count=64)
        with pytest.raises(PassError) as e:
            compile_backend("flashinfer", opts)
        err = e.value
        saved = json.load(open(os.path.join(err.repro, "options.json")))  # every option a pass reads
        assert "backend" not in saved  # the spec reads its own options; no pass does
        assert attrs.evolve(CompileOptions(**saved), dump_dir=str(tmp_path), backend=opts.backend) == opts
        assert err.pass_name == "explode-test" and err.ran == ["specialize-batch"]
        assert "ZeroDivisionError: boom" in str(err) and err.repro in str(err)
        assert sorted(os.listdir(err.repro)) == ["input.ir", "options.json", "repro.py"]
        with pytest.raises(PassError, match="ZeroDivisionError: boom"):  # the bundle reproduces it
            runpy.run_path(os.path.join(err.repro, "repro.py"))
    finally:
        PASSES.pop("explode-test")


def test_a_crash_on_a_graph_the_printer_cannot_print_still_writes_its_bundle(tmp_path, monkeypatch):
    """A spec's string dtype once crashed pack-inputs, then the IR printer and write_repro on the same graph: no
    bundle, and the failure printer's own traceback. A pass that leaves such a graph, then one that crashes."""
    from attnmeta.compiler.instruments import PrintIR

    @register_pass("corrupt-test")
    def corrupt(g, ctx):
        """Leaves an input whose dtype is a string (no IR printer prints it)."""
        i = g.inputs[0]
        return attrs.evolve(g, inputs=(attrs.evolve(i, type=attrs.evolve(i.type, dtype="int32")), *g.inputs[1:]))

    @register_pass("explode-test")
    def explode(g, ctx):
        """Crashes on purpose."""
        raise ZeroDivisionError("boom")

    try:
        monkeypatch.setattr("attnmeta.compiler.pipeline.PER_BS_PASSES",
                            (*PER_BS_PASSES[:1], "corrupt-test", "explode-test"))
        opts = CompileOptions(max_bs=4, capture_sizes=(2,), dump_dir=str(tmp_path), verify_each=False)
        shown = io.StringIO()
        with pytest.raises(PassError) as e:
            compile_backend("triton", opts, instruments=[PrintIR(shown, after=set(), on_failure=True)])
        err = e.value
        assert err.repro and sorted(os.listdir(err.repro)) == ["input.ir", "options.json", "repro.py"]
        text = open(os.path.join(err.repro, "input.ir")).read()
        assert text.startswith("// the IR printer failed on this graph") and "nodes" in text
        assert "ZeroDivisionError: boom" in str(err) and err.repro in str(err)
        # verifying after every pass, the verifier names the pass that made the graph, before any crash
        with pytest.raises(PassError, match=r"(?s)pass 'corrupt-test' failed.*input %seq_lens has dtype 'int32' "
                                            r"\(str\), not a DType"):
            compile_backend("triton", attrs.evolve(opts, verify_each=True))
    finally:
        PASSES.pop("corrupt-test")
        PASSES.pop("explode-test")


def test_disabling_hoist_makes_check_split_name_the_upgrade():
    from attnmeta.compiler import BackendSpec
    from tests.passes.test_semantics import rich_spec

    spec = BackendSpec("rich", rich_spec, (ForwardMode.DECODE,))
    compile_backend(spec, CompileOptions(max_bs=8, capture_sizes=(4,), max_context_len=24))
    with pytest.raises(SplitError) as e:
        compile_backend(spec, CompileOptions(max_bs=8, capture_sizes=(4,), max_context_len=24,
                                             disabled_passes=("hoist-upgrades",)))
    named = {v.node for v in e.value.violations if v.rule == "unstable-buffer"}
    assert len(named) == 3  # the three movable upgrade steps, each named


def test_print_after_change_prints_only_changes():
    out = io.StringIO()
    compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2,)),
                    instruments=[PrintAfterAll(out, only_changes=True)])
    text = out.getvalue()
    assert "IR Dump After specialize-batch (decode, bs=2)" in text and "IR Dump After pack-inputs (decode)" in text
    assert "IR Dump After check-split" not in text and "IR Dump After verify" not in text


def test_timing_covers_every_pass_that_ran():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(1, 2)))
    assert {"verify", "specialize-batch", "check-split", "fuse"} <= set(cb.timing.seconds)
