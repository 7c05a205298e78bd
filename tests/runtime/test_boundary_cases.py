"""The boundary holes fuzzing and review found, each a typed error naming the value and the fix (or
the right result): batches, pools, runners, specs and ``.ir`` text."""

import pytest
import torch

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import DType, Kind, Placement, SpecBuilder, parse
from attnmeta.compiler.ir.errors import ContractError, UserError
from attnmeta.compiler.ir.parser import ParseError
from attnmeta.compiler.lowering.binding import Kind as SlotKind
from attnmeta.runtime import BatchError, DecodeModel, ForwardBatch, GraphRunner
from attnmeta.runtime.staging import DeviceGuard
from tests.batches import make_pool

L, ROWS = 64, 6


def backend(name="triton"):
    cb = compile_backend(name, CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L))
    return cb.instantiate(make_pool(ROWS, L))


def batch(seq, rows, **kw):
    seq, rows = torch.tensor(seq, dtype=torch.int32), torch.tensor(rows)
    return ForwardBatch(ForwardMode.DECODE, len(rows), req_pool_indices=rows, req_pool_indices_cpu=rows,
                        seq_lens=seq, seq_lens_cpu=seq, **kw)


def test_a_2d_host_length_is_refused():
    fb = batch([3, 4], [1, 2])
    fb.seq_lens_cpu = torch.tensor([[3, 5], [4, 6]], dtype=torch.int32)
    with pytest.raises(BatchError, match=r"seq_lens_cpu must be one value per row \(1-D\), got shape \(2, 2\)"):
        backend().init_forward_metadata(fb)


def test_a_pool_whose_columns_are_not_consecutive_is_refused():
    """A transposed or column-sliced req_to_token: the Triton kernels step rows by one stride only."""
    cb = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    t = make_pool(L, ROWS).t()  # [ROWS, L] with column stride ROWS
    with pytest.raises(BatchError, match="pool req_to_token has column stride 6"):
        cb.instantiate(t)
    assert cb.instantiate(t.contiguous()).pools["req_to_token"].stride(1) == 1


def test_an_engines_own_or_a_string_mode_is_named():
    fb = batch([3], [1])
    object.__setattr__(fb, "forward_mode", "decode")
    with pytest.raises(BatchError, match="forward_mode must be attnmeta's ForwardMode .* got 'decode'"):
        backend().init_forward_metadata(fb)


def test_the_runner_refuses_a_short_query_and_a_run_before_capture():
    be = backend()
    k = v = torch.randn(ROWS * L + 1, 2, 8)
    runner = GraphRunner(be, DecodeModel(k, v, 4, L), (2, 4), "cpu")
    with pytest.raises(ContractError, match=r"GraphRunner.run before capture\(\)"):
        runner.run(batch([3, 4], [1, 2]), torch.randn(2, 2, 8))
    runner.capture()
    with pytest.raises(BatchError, match="the query has 1 rows for a batch of 2 requests"):
        runner.run(batch([3, 4], [1, 2]), torch.randn(1, 2, 8))
    fb = batch([3, 4], [1, 2])
    object.__setattr__(fb, "forward_mode", "decode")
    with pytest.raises(BatchError, match="forward_mode must be attnmeta's ForwardMode"):
        runner.run(fb, torch.randn(2, 2, 8))
    assert runner.run(batch([3, 4], [1, 2]), torch.randn(2, 2, 8)).shape == (2, 2, 8)


def _spec(body):
    def build(mode, options):
        b = SpecBuilder("edge")
        seq = b.input("seq_lens", DType.int32, ["bs"], fill=1, mirror="seq_lens_cpu", kind=Kind.length)
        b.input("seq_lens_cpu", DType.int32, ["bs"], Placement.host, fill=1, kind=Kind.length)
        with b.in_graph():
            out = body(b, seq)
        b.outputs(out=out)
        return b.build()
    return BackendSpec("edge", build, (ForwardMode.DECODE,))


@pytest.mark.parametrize("body,match", [
    (lambda b, s: b.slice(s, 0, "bs + 1"), r"slice \[0:bs \+ 1\] ends past its input's extent bs"),
    (lambda b, s: b.slice(s, 0, "bs - 3"), "does not hold at batch size 2: slice .* has a negative stop"),
    (lambda b, s: b.ewise("floordiv", s, 0), "ewise 'floordiv' by the constant 0"),
    (lambda b, s: b.ewise("add", s, 1.5), "second operand must be a value or an int constant, got float 1.5"),
    (lambda b, s: b.full(True, ["bs"], DType.int32), "must be int, got bool"),
], ids=["past-extent", "negative-at-a-size", "divide-by-zero", "float-constant", "bool-value"])
def test_spec_mistakes_are_spec_errors(body, match):
    with pytest.raises(UserError, match=match):
        compile_backend(_spec(body), CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L))


def test_a_float_fill_is_a_spec_error():
    def build(mode, options):
        b = SpecBuilder("edge")
        b.input("seq_lens", DType.int32, ["bs"], fill=1.5, kind=Kind.length)
    with pytest.raises(UserError, match=r"input 'seq_lens' has fill 1.5 \(float\)"):
        compile_backend(BackendSpec("edge", build, (ForwardMode.DECODE,)), CompileOptions(max_bs=2))


def test_a_bad_escape_in_ir_text_is_a_parse_error():
    with pytest.raises(ParseError, match=r"bad escape in the string \"\\q\""):
        parse('graph "\\q" {\n}')


def test_device_only_values_are_guarded_and_reported_one_step_late():
    """A field the batch has on the device only: its bad value is replaced where it is staged (a row by 0,
    a length by its nearest bound) and the next step raises a BatchError naming field, row and value."""
    guard = DeviceGuard(torch.device("cpu"))

    class Slot:  # the two facts of a staged slot the guard reads
        full_range, lo, hi = False, 0, 10
        slot = type("S", (), {"kind": SlotKind.length})()

    dst = torch.zeros(3, dtype=torch.int32)
    guard.stage(Slot, torch.tensor([4, 99, -2], dtype=torch.int64), dst, "seq_lens", capture=False)
    guard.flush()
    assert dst.tolist() == [4, 10, 0]  # nothing outside the range reaches a kernel
    with pytest.raises(BatchError, match=r"the previous step staged seq_lens\[1\] = 99 from the device"):
        guard.raise_pending()
    guard.raise_pending()  # reported once
    dst2 = torch.zeros(2, dtype=torch.int32)
    guard.stage(Slot, torch.tensor([1, 2]), dst2, "seq_lens", capture=False)
    guard.flush()
    guard.raise_pending()  # a good step reports nothing
    assert dst2.tolist() == [1, 2]
