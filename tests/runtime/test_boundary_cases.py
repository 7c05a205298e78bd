"""The boundary holes fuzzing and review found, each a typed error naming the value and the fix (or
the right result): batches, pools, runners, specs and ``.ir`` text."""

import re

import pytest
import torch

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import DType, Kind, Placement, SpecBuilder, parse
from attnmeta.compiler.ir.builder import SpecError
from attnmeta.compiler.ir.errors import ContractError, UserError
from attnmeta.compiler.ir.parser import ParseError
from attnmeta.compiler.lowering.binding import Kind as SlotKind
from attnmeta.runtime import BatchError, ForwardBatch
from attnmeta.sim import DecodeModel, GraphRunner
from tests.batches import make_pool

pytestmark = pytest.mark.overflow_checked  # the kernels' own tests: int32 overflow checked

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


def _fed_plan(L: int = 16):
    """A flashinfer decode plan of 4 rows (captured sizes 2 and 4) and its seq_lens slot: what a step that has the
    lengths on the device only (no host mirror) feeds."""
    from tests.batches import make_batch

    pool = make_pool(12, L)
    be = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2, 4),
                                                      max_context_len=L)).instantiate(pool)
    b = be.bound(ForwardMode.DECODE, 4)
    be.init_forward_metadata_out_graph(make_batch(4, L, 12, seed=1))  # staged from the host: rows, fills
    seq = next(s for s in b.stager.slots if s.source == "seq_lens_cpu")
    return be, b, seq


def _feed(b, s, values: list[int]) -> None:
    """What out_graph does with a device-only field: its live values into the feed, the staging past them padded
    with the fill, and the packed copy."""
    s.fed(torch.tensor(values, dtype=torch.int64), len(values))
    s.pad(len(values), 4)
    for dev, host in b.stager.copies:
        dev.copy_(host)


def test_device_only_values_are_guarded_and_reported_at_a_later_step():
    """A field the batch has on the device only: its live values go to the input's feed, the graph's check
    replaces a bad one where the kernel reads it (a length by its nearest bound), rows past the live ones read
    the staged fill, and a later step raises a BatchError naming field, row and value, once."""
    be, b, s = _fed_plan()
    be.record.raise_pending()  # a fresh record holds nothing (it is zeroed when made)
    _feed(b, s, [4, 99, -2])
    b.in_fn(*b.in_args)
    ind = b.meta.kv_indptr.tolist()
    assert [ind[k + 1] - ind[k] for k in range(4)] == [4, 16, 0, 1]  # nothing outside the range reaches a kernel
    assert be.record.tensor.tolist() == [1, 256, 1, 99]  # the first bad row, written by the check itself
    with pytest.raises(BatchError, match=r"an earlier step staged seq_lens\[1\] = 99 from the device"):
        be.record.raise_pending()
    be.record.raise_pending()  # reported once
    _feed(b, s, [1, 2])
    b.in_fn(*b.in_args)
    be.record.raise_pending()  # a good step reports nothing
    ind = b.meta.kv_indptr.tolist()
    assert [ind[k + 1] - ind[k] for k in range(4)] == [1, 2, 1, 1]  # the rows a larger step fed are padding again


def test_the_device_check_is_recorded_with_the_graph_and_replays_on_new_values():
    """Captured once, the check runs inside every replay on what out_graph fed: a replay costs the host one
    copy, and still replaces and reports a bad value."""
    from attnmeta.runtime.graphs import EmulatedGraph

    be, b, s = _fed_plan()
    g = EmulatedGraph()
    with g.capture():
        b.in_fn(*b.in_args)
    be.record.raise_pending()
    _feed(b, s, [5, 6])
    g.replay()
    be.record.raise_pending()
    assert b.meta.kv_indptr.tolist() == [0, 5, 11, 12, 13]
    _feed(b, s, [7, 70, 8, 3])
    g.replay()
    assert b.meta.kv_indptr.tolist() == [0, 7, 23, 31, 34]
    with pytest.raises(BatchError, match=r"seq_lens\[1\] = 70"):
        be.record.raise_pending()


def test_a_graph_replayed_after_a_smaller_batch_was_staged_reads_padding():
    """Bug class 19: an engine that dispatches before it pads stages a 2-row batch, then replays the
    graph captured for 4 rows. Rows 2 and 3 read the padding (fill length 1 on the reserved row 0), not
    the rows an earlier 4-row step staged."""
    from tests.batches import capture, make_batch

    L, rows = 64, 16
    pool = make_pool(rows, L)
    be = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L)).instantiate(pool)
    graphs = {bs: capture(be, make_batch(bs, L, rows, seed=bs)) for bs in (2, 4)}
    be.init_forward_metadata_out_graph(make_batch(4, L, rows, seed=7, max_len=40))  # 4 long live rows
    graphs[4].replay()
    small = make_batch(2, L, rows, seed=8)
    be.init_forward_metadata_out_graph(small)  # the 2-row plan staged...
    graphs[4].replay()  # ...and the 4-row graph replayed
    m = be.bound(ForwardMode.DECODE, 4).meta
    ind = m.kv_indptr.tolist()
    assert [ind[k + 1] - ind[k] for k in range(4)] == [*small.seq_lens_cpu.tolist(), 1, 1]
    assert m.kv_indices[ind[2]:ind[4]].tolist() == [int(pool[0, 0])] * 2
    # and it is reported: the 2-row batch has a graph of its own, which is the one to replay (issue c19)
    with pytest.raises(BatchError, match="replayed the graph of 4 rows over a batch staged for 2 rows"):
        be.init_forward_metadata_out_graph(small)


@pytest.mark.parametrize(("call", "says"), [
    (lambda cb: __import__("attnmeta.runtime", fromlist=["new_graph"]).new_graph("gpu"),
     "device must be a torch.device or a name like 'cpu'"),
    (lambda cb: compile_backend("triton", {"max_bs": 4}), "options must be a CompileOptions"),
    (lambda cb: CompileOptions(max_bs="8"), "max_bs must be an int, got '8'"),
    (lambda cb: cb.instantiate([[0]]), "req_to_token must be the engine's pool"),
    (lambda cb: cb.instantiate(make_pool(4, 64), device="gpu"), "device must be a torch.device"),
    (lambda cb: compile_backend(42), "compile_backend takes a BackendSpec or its name"),
])
def test_bad_python_api_arguments_are_typed_errors(call, says):
    cb = compile_backend("triton", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=64))
    with pytest.raises(UserError, match=re.escape(says)):
        call(cb)


@pytest.mark.parametrize("dtype", [DType.float32, DType.bool])
@pytest.mark.parametrize("kind", [SlotKind.length, SlotKind.row])
def test_a_length_or_row_input_of_a_float_or_bool_dtype_is_a_spec_error_naming_it(dtype, kind):
    """Not a bare TypeError from deep in the compiler: the input, its spec line and the fix."""
    def build(mode, options):
        b = SpecBuilder("edge")
        b.input("seq_lens", dtype, ["bs"], fill=1, kind=kind)

    with pytest.raises(SpecError, match=rf"test_boundary_cases.py:\d+: input 'seq_lens' holds {kind.value}s but "
                                        r"has dtype .*declare it DType.int32 or DType.int64"):
        compile_backend(BackendSpec("edge", build, (ForwardMode.DECODE,)), CompileOptions(max_bs=2))


def test_a_verify_batch_with_another_draft_count_is_refused_naming_both():
    """Compiled for 4 draft tokens, handed a verify batch of 8 per request: refused, not strided by 4."""
    from types import SimpleNamespace

    L = 64
    be = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L,
                                                  modes=("decode", "target_verify"), num_draft_tokens=4)
                         ).instantiate(make_pool(8, L))
    fb = ForwardBatch(ForwardMode.TARGET_VERIFY, 2, req_pool_indices=torch.tensor([1, 2]),
                      req_pool_indices_cpu=torch.tensor([1, 2]), seq_lens=torch.tensor([5, 6], dtype=torch.int32),
                      seq_lens_cpu=torch.tensor([5, 6], dtype=torch.int32),
                      spec_info=SimpleNamespace(draft_token_num=8))
    with pytest.raises(BatchError, match=r"8 draft tokens per request .* compiled for num_draft_tokens=4"):
        be.init_forward_metadata(fb)
    fb.spec_info.draft_token_num = 4
    be.init_forward_metadata(fb)  # the compiled count is served


def test_a_size_without_a_graph_plans_the_graph_an_engine_pads_it_to():
    """An engine stages 2 live rows (no graph of 2 was captured), then replays the 4-row graph: the 4-row
    plan's host planner planned from those rows (its host indptr: the 2 lengths, then the fill length 1 of
    the padded rows), not from the capture batch."""
    from tests.batches import capture, make_batch

    L, rows = 64, 16
    be = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L)
                         ).instantiate(make_pool(rows, L))
    g = capture(be, make_batch(4, L, rows, seed=4, max_len=40))
    small = make_batch(2, L, rows, seed=8)
    be.init_forward_metadata_out_graph(small)  # the 2-row plan, compiled on demand, staged...
    g.replay()  # ...and the 4-row graph replayed
    s0, s1 = small.seq_lens_cpu.tolist()
    assert be.bound(ForwardMode.DECODE, 4).meta.kv_indptr_host.tolist() == [0, s0, s0 + s1, s0 + s1 + 1,
                                                                            s0 + s1 + 2]
