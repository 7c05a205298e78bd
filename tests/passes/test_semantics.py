"""Every pass preserves the interpreter's result, and the interpreter agrees
with the hand-written eager twin, on random batches."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnmeta.backends import get_eager, get_spec
from attnmeta.compiler import CompileOptions, ForwardMode
from attnmeta.compiler.ir import eval_graph, valid_prefix
from attnmeta.compiler.passes.registry import PassContext
from attnmeta.compiler.pipeline import GENERIC_PASSES, PER_BS_PASSES, run_passes
from tests.batches import capture, interp_inputs, make_batch, make_pool

L, ROWS, MAX_BS = 24, 12, 8
OPTS = CompileOptions(max_bs=MAX_BS, max_context_len=L)
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}


def run(g, inputs):
    outs = eval_graph(g, inputs)
    return {f: valid_prefix(g, outs, f) for f, v in outs.items() if isinstance(v, torch.Tensor)}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@given(raw=st.integers(0, MAX_BS), pad=st.integers(0, 3), seed=st.integers(0, 10_000))
def test_every_pass_preserves_interpreter_result(raw, pad, seed):
    bs = min(MAX_BS, max(1, raw + pad))
    pool = make_pool(ROWS, L, seed)
    fb = make_batch(raw, L, ROWS, seed)
    inputs = interp_inputs(fb, bs, pool, FILLS)
    ctx = PassContext(OPTS, ForwardMode.DECODE, bs)
    g = get_spec("flashinfer").build(ForwardMode.DECODE, OPTS)
    want = run(run_passes(g, ["specialize-batch"], ctx), inputs)
    for name in GENERIC_PASSES:  # mode-generic passes: compare after specializing
        g = run_passes(g, [name], ctx)
        same(run(run_passes(g, ["specialize-batch"], ctx), inputs), want)
    for name in PER_BS_PASSES:
        g = run_passes(g, [name], ctx)
        same(run(g, inputs), want)


@given(raw=st.integers(0, MAX_BS), seed=st.integers(0, 10_000))
def test_interpreter_matches_eager_twin(raw, seed):
    pool = make_pool(ROWS, L, seed)
    fb = make_batch(raw, L, ROWS, seed)
    ctx = PassContext(OPTS, ForwardMode.DECODE, raw)
    g = run_passes(get_spec("flashinfer").build(ForwardMode.DECODE, OPTS), ["specialize-batch"], ctx)
    got = run(g, interp_inputs(fb, raw, pool, FILLS))
    ref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(fb)
    for field in ("kv_indptr", "kv_indices", "kv_last_page_len", "kv_indptr_host"):
        assert torch.equal(got[field], getattr(ref, field)), field


def test_hand_computed_case():
    """Two requests over a tiny pool, checked against values worked out by hand."""
    pool = torch.zeros(3, 4, dtype=torch.int32)
    pool[1] = torch.tensor([7, 3, 9, 0], dtype=torch.int32)
    pool[2] = torch.tensor([4, 8, 6, 5], dtype=torch.int32)
    inputs = {"req_to_token": pool, "seq_lens": torch.tensor([4, 2, 1], dtype=torch.int32),
              "seq_lens_cpu": torch.tensor([4, 2, 1], dtype=torch.int32),
              "req_pool_indices": torch.tensor([2, 1, 0])}
    opts = CompileOptions(max_bs=3, max_context_len=4)
    g = run_passes(get_spec("flashinfer").build(ForwardMode.DECODE, opts), ["specialize-batch"],
                   PassContext(opts, ForwardMode.DECODE, 3))
    out = run(g, inputs)
    assert out["kv_indptr"].tolist() == [0, 4, 6, 7]
    assert out["kv_indices"].tolist() == [4, 8, 6, 5, 7, 3, 0]
    assert out["kv_last_page_len"].tolist() == [1, 1, 1]
    assert out["kv_indptr_host"].tolist() == [0, 4, 6, 7]


def rich_spec(mode, opts):
    """Many ops, a movable upgrade declared out of graph, a duplicate and a dead step."""
    from attnmeta.compiler.ir import DType, Placement, SpecBuilder

    I32, I64 = DType.int32, DType.int64
    b = SpecBuilder("rich")
    seq = b.input("seq_lens", I32, ["bs"], fill=1, mirror="seq_lens_cpu")
    cpu = b.input("seq_lens_cpu", I32, ["bs"], Placement.host, fill=1)
    rpi = b.input("req_pool_indices", I64, ["bs"], fill=0)
    r2t = b.pool("req_to_token", I32, ["R", "L"])
    with b.out_graph(movable=True):
        pos = b.ewise("sub", seq, 1)
        swa = b.ewise("min", pos, 5)
        rep = b.repeat(swa, 2)
    with b.in_graph():
        ind = b.cumsum(seq)
        ind2 = b.cumsum(seq)  # cse folds it into ind
        idx = b.ragged_gather(r2t, rpi, seq, ind2, capacity="max_bs*L")
        pt = b.page_table(r2t, rpi, seq, page_size=4, width="ceiling(L/4)")
        odd = b.compare("eq", b.ewise("sub", seq, b.ewise("mul", b.ewise("floordiv", seq, 2), 2)), 1)
        sel = b.where(odd, seq, 0)
        b.ewise("mul", sel, 3)  # dead
        tail = b.lookup(b.cast(b.arange("L", dtype=I32), I32), b.ewise("min", pos, b.full(0, [], I32)))
    with b.out_graph():
        host_ind = b.cumsum(cpu)
        plan = b.host_call("flashinfer.decode_plan", host_ind, b.full(1, ["bs"], I32, Placement.host))
    b.outputs(ind=ind, idx=idx, pt=pt, rep=rep, sel=sel, tail=tail, host_ind=host_ind, plan=plan,
              ragged={"idx": "ind"})
    return b.build()


@given(raw=st.integers(0, MAX_BS), pad=st.integers(0, 2), seed=st.integers(0, 10_000))
def test_every_pass_preserves_a_rich_spec(raw, pad, seed):
    bs = min(MAX_BS, max(1, raw + pad))
    pool = make_pool(ROWS, L, seed)
    inputs = interp_inputs(make_batch(raw, L, ROWS, seed), bs, pool, FILLS)
    ctx = PassContext(OPTS, ForwardMode.DECODE, bs)
    g = rich_spec(ForwardMode.DECODE, OPTS)
    want = run(run_passes(g, ["specialize-batch"], ctx), inputs)
    for name in GENERIC_PASSES:
        g = run_passes(g, [name], ctx)
        same(run(run_passes(g, ["specialize-batch"], ctx), inputs), want)
    for name in PER_BS_PASSES:
        g = run_passes(g, [name], ctx)
        same(run(g, inputs), want)
    assert all(n.region.value == "in_graph" for n in g.nodes if n.movable)  # the upgrade was hoisted
    assert len([n for n in g.nodes if n.op.value == "cumsum" and n.region.value == "in_graph"]) == 1


def rows_spec(mode, options):
    """[bs, M] values as DSV4 builds them: a window of slots before each sequence's end, its
    translation through a slot table, page indices gathered from the page table, flattened."""
    from attnmeta.compiler.ir import DType, SpecBuilder

    I32 = DType.int32
    b = SpecBuilder("rows")
    seq = b.input("seq_lens", I32, ["bs"], fill=1)
    rpi = b.input("req_pool_indices", DType.int64, ["bs"], fill=0)
    r2t = b.pool("req_to_token", I32, ["R", "L"])
    with b.in_graph():
        last = b.ewise("sub", seq, 1)
        cols = b.outer("sub", last, b.arange(6))  # the 6 slots up to the last token, newest first
        slots = b.gather_rows(r2t, rpi, cols)  # -1 before the sequence start
        to_swa = b.ewise("mod", b.arange(ROWS * L + 1), 7)  # a slot translation table
        swa = b.where(b.compare("ge", slots, b.full(0, [], I32)), b.lookup(to_swa, b.ewise("max", slots, 0)),
                      b.full(-1, [], I32))
        pt = b.page_table(r2t, rpi, seq, page_size=4, width="ceiling(L/4)")
        halves = b.outer("add", b.full(0, ["bs"], I32), b.ewise("floordiv", b.arange(8), 2))
        pages = b.ewise("add", b.ewise("mul", b.gather_rows(pt, b.arange("bs", dtype=DType.int64), halves), 2),
                        b.outer("add", b.full(0, ["bs"], I32), b.ewise("mod", b.arange(8), 2)))  # after the page table
        ends = b.outer("gt", b.ewise("floordiv", seq, 2), b.arange(8))
        b.outputs(swa=swa, flat=b.flatten(swa), pages=b.where(ends, pages, b.full(-1, [], I32)), pt=pt)
    return b.build()


def test_rows_spec_is_two_kernels():
    """The window chain and the page table in one kernel, what reads the page table in the next."""
    from attnmeta.compiler import BackendSpec, compile_backend

    cb = compile_backend(BackendSpec("rows", rows_spec, (ForwardMode.DECODE,)),
                         CompileOptions(max_bs=MAX_BS, capture_sizes=(1, 4, MAX_BS), max_context_len=L))
    assert all(cb.kernels(ForwardMode.DECODE, bs) == 2 for bs in (1, 4, MAX_BS))


@pytest.mark.parametrize("spec_fn", [rich_spec, rows_spec], ids=["rich", "rows"])
def test_spec_compiles_and_runs_through_the_runtime(spec_fn):
    """The lowered plan (eager and captured on the emulated graph) equals the interpreter."""
    from attnmeta.backends.reference import ReferenceDecodePlanner
    from attnmeta.compiler import BackendSpec, compile_backend
    from attnmeta.runtime import ReplayView

    spec = BackendSpec("spec", spec_fn, (ForwardMode.DECODE,),  # the rich spec's planner: a stand-in it declares
                       planners={"flashinfer.decode_plan": ReferenceDecodePlanner})
    cb = compile_backend(spec, CompileOptions(max_bs=MAX_BS, capture_sizes=(4,), max_context_len=L))
    pool = make_pool(ROWS, L, 3)
    be = cb.instantiate(pool)
    cap = make_batch(4, L, ROWS, 1, max_len=3)
    gr = capture(be, cap)
    for seed, raw in [(5, 4), (6, 3), (7, 0)]:
        fb = make_batch(raw, L, ROWS, seed)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, 4))
        gr.replay()
        plan = cb.plan(ForwardMode.DECODE, 4)
        want = run(plan.graph, interp_inputs(fb, 4, pool, FILLS))
        m = be.forward_metadata
        for field, w in want.items():
            got = getattr(m, field)
            assert torch.equal(got[: w.shape[0]] if field == "idx" else got, w), field


def test_flashinfer_decode_is_one_fused_kernel_per_step():
    from attnmeta.compiler import compile_backend

    cb = compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=(1, 5, MAX_BS), max_context_len=L))
    for row in cb.summary():
        assert row["kernels"] == "1", row
    assert all(cb.kernels(ForwardMode.DECODE, bs) == 1 for bs in (1, 5, MAX_BS))
    sources = {k.source for p in cb.plans.values() for k in p.kernels}
    assert len(sources) == 1  # bs is a runtime argument: one kernel source serves every captured size


@pytest.mark.parametrize(("name", "page"), [("tbo_flashinfer", 1), ("dsv4", 256)])
def test_every_size_shares_one_lowered_program(name, page):
    """TBO children's row ranges are views bound once and fused kernels store into static
    buffers, so no batch size appears in the code: one fx module serves every captured size."""
    from attnmeta.compiler import compile_backend

    sizes = tuple(range(2, 33, 2))
    cb = compile_backend(name, CompileOptions(max_bs=32, capture_sizes=sizes, max_context_len=1024, page_size=page))
    plans = [cb.plan(ForwardMode.DECODE, bs) for bs in sizes]
    assert len({id(p.in_gm) for p in plans}) == 1 and len({id(p.out_gm) for p in plans}) == 1
    assert "k_slice" not in plans[0].in_gm.code + plans[0].out_gm.code


def batch_wide_spec(mode, options):
    """Per column k of a fixed width, how many prefix sums of the lengths are at most k: a matrix
    [8, bs + 1] whose width changes with the batch size."""
    from attnmeta.compiler.ir import DType, SpecBuilder

    I32 = DType.int32
    b = SpecBuilder("batch_wide")
    seq = b.input("seq_lens", I32, ["bs"], fill=1)
    b.input("req_pool_indices", DType.int64, ["bs"], fill=0)
    b.pool("req_to_token", I32, ["R", "L"])
    with b.in_graph():
        ex = b.cumsum(seq)  # [bs + 1]
        below = b.cast(b.outer("ge", b.ewise("mul", b.arange(8), 3), ex), I32)
        count = b.op("reduce_rows", below, fn="sum")
    b.outputs(count=count, ex=ex)
    return b.build()


def test_sizes_whose_columns_differ_do_not_share_kernels():
    """One kernel source serves every captured size only where its column widths agree: replayed at
    each size, a [8, bs + 1] matrix equals the interpreter's (a shared kernel would keep one width)."""
    from attnmeta.compiler import BackendSpec, compile_backend
    from attnmeta.runtime import ReplayView

    sizes = (2, 5, MAX_BS)
    cb = compile_backend(BackendSpec("batch_wide", batch_wide_spec, (ForwardMode.DECODE,)),
                         CompileOptions(max_bs=MAX_BS, capture_sizes=sizes, max_context_len=L))
    pool = make_pool(ROWS, L, 3)
    be = cb.instantiate(pool)
    graphs = {bs: capture(be, make_batch(bs, L, ROWS, 1, max_len=3)) for bs in sizes}
    for bs in sizes:
        fb = make_batch(bs, L, ROWS, seed=bs)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        graphs[bs].replay()
        want = run(cb.plan(ForwardMode.DECODE, bs).graph, interp_inputs(fb, bs, pool, FILLS))
        assert torch.equal(be.forward_metadata.count, want["count"]), bs
        assert torch.equal(be.forward_metadata.count, (torch.arange(8)[:, None] * 3 >= want["ex"]).sum(1).int())
