"""The device check as IR (guard-inputs' ``ingest``, compiler/ir/ops_guard.py), fused into the step's first kernel:
a value the host staged is read as it is; one fed from the device or read in place from the engine's buffer is
checked, a bad one replaced (a length clamped, a row by 0) and the first recorded (code, row, value); a staging
written for another size is recorded too. Each case by hand, through the compiled kernel (Triton's interpreter in
this suite), the op's torch twin and the reference interpreter, which must agree."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import Op, eval_graph
from attnmeta.compiler.ir.ops_guard import GENERATION, SENTINEL
from attnmeta.compiler.lowering.kernels import KERNELS
from attnmeta.compiler.passes.guard_inputs import guard_code
from tests.batches import make_pool

D = ForwardMode.DECODE
S = SENTINEL
L, ROWS = 64, 12


@pytest.fixture(scope="module")
def plan():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L))
    pool = make_pool(ROWS, L, 3)
    be = cb.instantiate(pool)
    return be, be.bound(D, 4), pool


def run(plan, seq, rows, seq_feed=None, rows_feed=None, word=0, gen=(4, 4), engine=None, record=None):
    """The plan's in_graph on staged ``seq``/``rows`` (int lists), with what the step fed from the device and the
    engine word; returns (kv_indptr, kv_indices, record) of the kernel and of the reference interpreter."""
    be, b, pool = plan
    args = {a.name: t for a, t in zip(b.binding.in_args, b.in_args, strict=True)}
    args["seq_lens"].copy_(torch.tensor(seq, dtype=torch.int32))
    args["req_pool_indices"].copy_(torch.tensor(rows, dtype=torch.int64))
    feeds = {"seq_lens__feed": seq_feed or [S] * 4, "req_pool_indices__feed": rows_feed or [S] * 4}
    for k, v in feeds.items():
        args[k].copy_(torch.tensor(v, dtype=torch.int64))
    eng = {f"{x}__engine": torch.tensor((engine or {}).get(x, [S] * 4), dtype=torch.int64)
           for x in ("seq_lens", "req_pool_indices")}
    in_args = [eng.get(a.name, t) for a, t in zip(b.binding.in_args, b.in_args, strict=True)]
    be.word.tensor.fill_(word)
    args["guard_generation"].copy_(torch.tensor(gen, dtype=torch.int32))
    be.record.tensor.copy_(torch.tensor(record or [0, 0, 0, 0]))
    b.in_fn(*in_args)
    got = (b.meta.kv_indptr.tolist(), b.meta.kv_indices[: b.meta.kv_indptr[-1]].tolist(), be.record.tensor.tolist())
    ref_rec = torch.tensor(record or [0, 0, 0, 0], dtype=torch.int64)
    ins = {"seq_lens": args["seq_lens"].clone(), "req_pool_indices": args["req_pool_indices"].clone(),
           "req_to_token": pool, "seq_lens_cpu": args["seq_lens"].clone(), **{k: args[k].clone() for k in feeds},
           **eng, "guard_word": torch.tensor(word, dtype=torch.int32),
           "guard_generation": torch.tensor(gen, dtype=torch.int32), "guard_record": ref_rec}
    out = eval_graph(b.plan.graph, ins)
    want = (out["kv_indptr"].tolist(), out["kv_indices"][: out["kv_indptr"][-1]].tolist(), ref_rec.tolist())
    assert got == want, (got, want)
    return got


def slots(pool, rows, seq):
    return [int(pool[r, j]) for r, s in zip(rows, seq, strict=True) for j in range(s)]


SEQ_CODE, ROW_CODE = guard_code(D, 0), guard_code(D, 1)


def test_a_staged_step_reads_what_the_host_staged_unchecked(plan):
    """Padding rows hold pool row 0 (the reserved row) and the capture's dummy rows too: not a fault."""
    indptr, idx, rec = run(plan, [3, 5, 1, 1], [4, 2, 0, 0])
    assert indptr == [0, 3, 8, 9, 10] and idx == slots(plan[2], [4, 2, 0, 0], [3, 5, 1, 1])
    assert rec == [0, 0, 0, 0]


def test_fed_values_are_checked_replaced_and_the_first_recorded(plan):
    """Rows fed from the device: row 1's pool row 99 is outside the pool (read as row 0), row 2's length 1000
    past L is clamped; the first fault in program order (seq_lens before req_pool_indices) is kept."""
    indptr, idx, rec = run(plan, [1, 1, 1, 1], [0, 0, 0, 0], seq_feed=[3, 5, 1000, S], rows_feed=[4, 99, 3, S])
    assert indptr == [0, 3, 8, 8 + L, 9 + L]
    assert idx == slots(plan[2], [4, 0, 3, 0], [3, 5, L, 1])
    assert rec == [1, SEQ_CODE, 2, 1000]


def test_a_fed_pool_row_0_is_a_fault_but_the_staged_padding_past_it_is_not(plan):
    _, _, rec = run(plan, [1, 1, 1, 1], [0, 0, 0, 0], seq_feed=[3, 5, S, S], rows_feed=[4, 0, S, S])
    assert rec == [1, ROW_CODE, 1, 0]


def test_the_engines_buffers_when_the_word_is_set_their_padding_row_0_allowed(plan):
    indptr, idx, rec = run(plan, [9, 9, 9, 9], [1, 1, 1, 1], word=1, gen=(7, 7),
                           engine={"seq_lens": [2, 6, 1, 1], "req_pool_indices": [5, 6, 0, 0]})
    assert indptr == [0, 2, 8, 9, 10] and idx == slots(plan[2], [5, 6, 0, 0], [2, 6, 1, 1])
    assert rec == [0, 0, 0, 0]  # the generation is not the engine's business: its buffers are its own
    _, _, rec = run(plan, [1] * 4, [0] * 4, word=1,
                    engine={"seq_lens": [2, 6, 1, 1], "req_pool_indices": [5, -3, 0, 0]})
    assert rec == [1, ROW_CODE, 1, -3]


@pytest.mark.parametrize("gen,bad", [((4, 4), False), ((3, 4), False), ((2, 2), True), ((1, 1), True), ((5, 8), True),
                                     ((0, 0), True)])
def test_a_graph_replayed_over_another_sizes_staging_is_recorded(plan, gen, bad):
    """The 4-row graph finds 4 where a step staged for it, or for 3 rows (no graph of its own: padded up to 4,
    ops_guard.pad_target); anything else (a staging for the 2-row graph, or never written) is a fault naming both
    sizes. The data read is the staging's own, padded."""
    indptr, _, rec = run(plan, [3, 5, 1, 1], [4, 2, 0, 0], gen=gen)
    assert indptr == [0, 3, 8, 9, 10]
    assert rec == ([1, SEQ_CODE | GENERATION, 4, gen[0]] if bad else [0, 0, 0, 0])


def test_a_record_already_set_is_kept(plan):
    _, _, rec = run(plan, [1] * 4, [0] * 4, rows_feed=[4, 99, S, S], record=[1, 7, 7, 7])
    assert rec == [1, 7, 7, 7]


def test_the_torch_twin_and_the_reference_agree_by_hand():
    """The op's CPU twin (one opaque launch) on hand cases: staged passes, fed and engine values checked."""
    staged = torch.tensor([1, 0, 0], dtype=torch.int64)
    a = dict(field="rows", code=5, lo=1, hi=9, hi_of=[], engine_lo=0, clamp=False, per_row=1, captured=[3],
             index=False, sized=False)
    for feed, word, engine, want, rec in (
            ([S, S, S], 0, [S] * 3, [1, 0, 0], [0, 0, 0, 0]),
            ([2, 10, S], 0, [S] * 3, [2, 0, 0], [1, 5, 1, 10]),
            ([S, S, S], 1, [0, 9, 10], [0, 9, 0], [1, 5, 2, 10])):
        record = torch.zeros(4, dtype=torch.int64)
        out = KERNELS[Op.ingest](staged, torch.tensor(feed), torch.tensor(engine),
                                 torch.tensor(word, dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32), record,
                                 **a)
        assert out.tolist() == want and record.tolist() == rec
