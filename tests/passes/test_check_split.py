"""One failing spec per check-split rule: the rule id, the node and the spec
line that made it are reported, all violations at once."""

import pytest

from attnmeta.compiler import CompileOptions, ForwardMode, SplitError, check_split, compile_backend
from attnmeta.compiler.ir import DType, Op, Placement, SpecBuilder
from attnmeta.compiler.passes.check_split import RULES

I32, I64 = DType.int32, DType.int64


def base():
    b = SpecBuilder("t")
    seq = b.input("seq_lens", I32, ["bs"], fill=1)
    cpu = b.input("seq_lens_cpu", I32, ["bs"], Placement.host, fill=1)
    rpi = b.input("req_pool_indices", I64, ["bs"], fill=0)
    r2t = b.pool("req_to_token", I32, ["R", "L"])
    return b, seq, cpu, rpi, r2t


def specialize(g, bs=4):
    from attnmeta.compiler.passes.registry import PassContext
    from attnmeta.compiler.passes.specialize_batch import specialize_batch

    return specialize_batch(g, PassContext(CompileOptions(max_bs=8, max_context_len=64), ForwardMode.DECODE, bs))


def violations(g):
    with pytest.raises(SplitError) as e:
        check_split(specialize(g))
    return e.value.violations


def line_of(marker: str) -> str:
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of" not in line:
                return f"tests/passes/test_check_split.py:{i}"
    raise AssertionError(marker)


def test_clean_spec_passes():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        ind = b.cumsum(seq)
        b.outputs(kv_indices=b.ragged_gather(r2t, rpi, seq, ind, capacity="max_bs*L"))
    g = specialize(b.build())
    assert check_split(g) is g


def test_dynamic_shape_in_graph():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        ind = b.cumsum(seq)
        nz = b.op(Op.nonzero, seq)  # MARK-dynamic
    b.outputs(ind=ind, nz=nz)
    vs = [v for v in violations(b.build()) if v.rule == "dynamic-shape-in-graph"]
    assert [v.node for v in vs] == [nz.name]
    assert vs[0].origin == line_of("MARK-dynamic")
    assert "static bound" in vs[0].fix


def test_host_value_in_graph():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        bad = b.cumsum(cpu)  # MARK-host
    b.outputs(bad=bad)
    (v,) = [v for v in violations(b.build()) if v.rule == "host-value-in-graph"]
    assert v.node == bad.name and v.origin == line_of("MARK-host")
    assert "%seq_lens_cpu" in v.message


def test_unrecordable_op_in_graph():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        total = b.reduce("sum", seq)
        host_total = b.op(Op.item, total)  # MARK-item
    b.outputs(t=host_total)
    (v,) = [v for v in violations(b.build()) if v.rule == "unrecordable-op-in-graph"]
    assert v.node == host_total.name and v.origin == line_of("MARK-item")
    assert "synchronises" in v.message and "seq_lens_cpu" in v.fix


def test_graph_to_host_edge():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        ind = b.cumsum(seq)
    with b.out_graph():
        plan = b.host_call("flashinfer.decode_plan", ind)  # MARK-edge
    b.outputs(ind=ind, plan=plan)
    (v,) = violations(b.build())
    assert (v.rule, v.node, v.origin) == ("graph-to-host-edge", plan.name, line_of("MARK-edge"))


def test_missing_fill_value():
    b, seq, cpu, rpi, r2t = base()
    pos = b.input("positions", I64, ["bs"])  # MARK-fill
    with b.in_graph():
        out = b.ewise("add", pos, 1)
    b.outputs(out=out)
    (v,) = violations(b.build())
    assert (v.rule, v.node, v.origin) == ("missing-fill-value", "positions", line_of("MARK-fill"))


def test_buffer_capacity():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        ind = b.cumsum(seq)
        idx = b.ragged_gather(r2t, rpi, seq, ind, capacity="L")  # MARK-cap
    b.outputs(idx=idx)
    (v,) = violations(b.build())
    assert (v.rule, v.node, v.origin) == ("buffer-capacity", idx.name, line_of("MARK-cap"))
    assert "capacity 64" in v.message and "256 entries" in v.message


def test_all_violations_reported_at_once_with_ids_in_message():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        a = b.cumsum(cpu)
        nz = b.op(Op.nonzero, seq)
    b.outputs(a=a, nz=nz)
    vs = violations(b.build())
    rules = {v.rule for v in vs}
    assert {"host-value-in-graph", "dynamic-shape-in-graph", "unrecordable-op-in-graph"} <= rules
    with pytest.raises(SplitError) as e:
        check_split(specialize(b.build()))
    for v in vs:
        assert f"[{v.rule}] %{v.node}" in str(e.value)


def test_rule_ids_are_the_designed_ones():
    designed = {"dynamic-shape-in-graph", "host-value-in-graph", "unrecordable-op-in-graph", "graph-to-host-edge",
                "unstable-buffer", "frozen-host-scalar", "missing-fill-value", "planner-not-replayed",
                "buffer-capacity", "capture-dependent-split"}
    assert set(RULES) <= designed


def test_compile_backend_rejects_bad_spec():
    from attnmeta.compiler import BackendSpec

    def build(mode, opts):
        b, seq, cpu, rpi, r2t = base()
        with b.in_graph():
            out = b.cumsum(cpu)
        b.outputs(out=out)
        return b.build()

    with pytest.raises(SplitError, match="host-value-in-graph"):
        compile_backend(BackendSpec("bad", build, (ForwardMode.DECODE,)), CompileOptions(max_bs=4))


def test_unstable_buffer():
    b, seq, cpu, rpi, r2t = base()
    with b.out_graph():
        ind = b.cumsum(seq)  # MARK-unstable
    b.outputs(kv_indptr=ind)
    (v,) = violations(b.build())
    assert (v.rule, v.node, v.origin) == ("unstable-buffer", ind.name, line_of("MARK-unstable"))
    assert "kv_indptr" in v.message and "in place" in v.fix


def test_frozen_host_scalar_as_field_and_as_graph_argument():
    b, seq, cpu, rpi, r2t = base()
    with b.out_graph():
        longest = b.reduce("max", cpu)  # MARK-max
    with b.in_graph():
        shifted = b.ewise("add", seq, longest)  # MARK-frozen
    b.outputs(max_seq_len_k=longest, shifted=shifted)
    vs = violations(b.build())
    assert {(v.rule, v.node, v.origin) for v in vs} == {
        ("frozen-host-scalar", longest.name, line_of("MARK-max")),
        ("frozen-host-scalar", shifted.name, line_of("MARK-frozen")),
    }


def test_constant_host_scalar_is_not_frozen():
    b, seq, cpu, rpi, r2t = base()
    with b.out_graph():
        c = b.full(4, [], I32, Placement.host)
    b.outputs(max_seq_len_q=c)
    check_split(specialize(b.build()))


def test_planner_not_replayed():
    b, seq, cpu, rpi, r2t = base()
    with b.in_graph():
        plan = b.host_call("flashinfer.decode_plan", seq)  # MARK-plan
    b.outputs(plan=plan)
    (v,) = violations(b.build())
    assert (v.rule, v.node, v.origin) == ("planner-not-replayed", plan.name, line_of("MARK-plan"))


def test_capture_dependent_split():
    b, seq, cpu, rpi, r2t = base()
    with b.out_graph():
        half = b.ewise("floordiv", b.reduce("sum", cpu), b.full(2, [], I32, Placement.host))
        child = b.op(Op.split_at, seq, half)  # MARK-split
    with b.in_graph():
        ind = b.cumsum(child)
    b.outputs(child_indptr=ind)
    vs = violations(b.build())
    assert ("capture-dependent-split", child.name, line_of("MARK-split")) in {(v.rule, v.node, v.origin) for v in vs}
    assert all(v.rule != "unrecordable-op-in-graph" for v in vs)


def test_every_designed_rule_is_implemented():
    assert len(RULES) == 10


def violations_via_generic(g, bs=4):
    """check-split as the pipeline runs it: with the mode-generic graph for facts no size shows."""
    with pytest.raises(SplitError) as e:
        check_split(specialize(g, bs), g)
    return e.value.violations


@pytest.mark.parametrize(("name", "fill", "kind", "why"), [
    ("req_pool_indices", 3, None, "is a live pool row"),
    ("seq_lens", -1, None, "is a negative length"),
    ("out_cache_loc", 5, "slot", "is a live KV slot"),
    ("out_cache_loc", -1, "slot", "is no KV slot"),
])
def test_unsafe_fill_values(name, fill, kind, why):
    """A fill that is a live row or slot, or a negative length: padded rows read or write live data."""
    from attnmeta.compiler.ir import Kind

    b = SpecBuilder("t")
    kw = {"kind": Kind(kind)} if kind else {}
    seq = b.input("seq_lens", I32, ["bs"], fill=fill if name == "seq_lens" else 1)
    rpi = b.input("req_pool_indices", I64, ["bs"], fill=fill if name == "req_pool_indices" else 0)
    loc = b.input("out_cache_loc", I64, ["bs"], fill=fill if name == "out_cache_loc" else 0, **kw)  # MARK-loc
    r2t = b.pool("req_to_token", I32, ["R", "L"])
    with b.in_graph():
        ind = b.cumsum(seq)
        b.outputs(kv_indices=b.ragged_gather(r2t, rpi, seq, ind, capacity="max_bs*L"), loc=b.copy(loc))
    (v,) = violations(b.build())
    assert (v.rule, v.node) == ("missing-fill-value", name)
    assert f"fill={fill} of {name} {why}" in v.message and "fill=" in v.fix


def test_a_passed_through_index_without_a_kind_needs_fill_zero():
    """An out_cache_loc-like input the spec only copies into a field: the engine's kernels index with it
    (a KV slot to write), which the spec cannot see, so a nonzero fill is refused until the kind is
    declared (then checked as that kind) or the fill is 0."""
    from attnmeta.compiler.ir import Kind

    def spec(fill, **kw):
        b = SpecBuilder("t")
        seq = b.input("seq_lens", I32, ["bs"], fill=1)
        loc = b.input("out_cache_loc", I64, ["bs"], fill=fill, **kw)  # MARK-pass
        with b.in_graph():
            b.outputs(kv_indptr=b.cumsum(seq), out_cache_loc=b.copy(loc))
        return b.build()

    (v,) = violations(spec(5))
    assert (v.rule, v.node, v.origin) == ("missing-fill-value", "out_cache_loc", line_of("MARK-pass"))
    assert "reaches field 'out_cache_loc'" in v.message and "kind=Kind.slot" in v.fix
    check_split(specialize(spec(0)))  # the reserved slot and row
    (v,) = violations(spec(5, kind=Kind.slot))  # declared: checked as a slot
    assert "is a live KV slot" in v.message
    check_split(specialize(spec(7, kind=Kind.length)))  # a length fill of 7 is safe


def test_safe_fills_pass_and_a_guarded_sentinel_row_is_safe():
    b = SpecBuilder("t")
    seq = b.input("seq_lens", I32, ["bs"], fill=0)
    rpi = b.input("req_pool_indices", I64, ["bs"], fill=-1)  # every row index is guarded: reads row 0
    r2t = b.pool("req_to_token", I32, ["R", "L"])
    with b.in_graph():
        ind = b.cumsum(seq)
        b.outputs(kv_indices=b.ragged_gather(r2t, rpi, seq, ind, capacity="max_bs*L"))
    check_split(specialize(b.build()))


def test_a_one_element_host_tensor_is_a_frozen_host_number():
    """[1] on the host is as frozen at capture as a 0-d number; a [bs] host tensor at bs 1 is not."""
    b, seq, cpu, rpi, r2t = base()
    with b.out_graph():
        longest = b.slice(b.cumsum(cpu, leading_zero=False), "bs - 1", "bs")  # MARK-one
        rows = b.cumsum(cpu)
    b.outputs(max_seq_len_k=longest, indptr_host=rows)
    g = b.build()
    (v,) = violations_via_generic(g)
    assert (v.rule, v.node, v.origin) == ("frozen-host-scalar", longest.name, line_of("MARK-one"))
    with pytest.raises(SplitError):
        check_split(specialize(g, 1), g)
    b2, seq, cpu, rpi, r2t = base()
    with b2.out_graph():
        rows = b2.cumsum(cpu, leading_zero=False)  # [bs]: one element at bs 1, still per-row
    b2.outputs(lens_host=rows)
    g2 = b2.build()
    check_split(specialize(g2, 1), g2)


def test_a_planner_fed_device_tensors_syncs_every_step():
    b, seq, cpu, rpi, r2t = base()
    with b.out_graph():
        plan = b.host_call("flashinfer.decode_plan", b.cumsum(seq))  # MARK-devplan
    b.outputs(plan=plan)
    vs = violations(b.build())
    v = next(v for v in vs if v.node == plan.name)
    assert (v.rule, v.origin) == ("graph-to-host-edge", line_of("MARK-devplan"))
    assert "blocks every step" in v.message and "seq_lens_cpu" in v.fix


def test_a_floor_width_page_table_drops_the_last_page():
    from attnmeta.compiler.ir import Kind

    b = SpecBuilder("t")
    seq = b.input("seq_lens", I32, ["bs"], fill=1, kind=Kind.length)
    rpi = b.input("req_pool_indices", I64, ["bs"], fill=0, kind=Kind.row)
    r2t = b.pool("req_to_token", I32, ["R", "L"])
    with b.in_graph():
        pt = b.page_table(r2t, rpi, seq, page_size=16, width="floor(L/16)")  # MARK-floor
    b.outputs(page_table=pt)
    g = b.build()
    from attnmeta.compiler.passes.registry import PassContext
    from attnmeta.compiler.passes.specialize_batch import specialize_batch

    at = specialize_batch(g, PassContext(CompileOptions(max_bs=8, max_context_len=72), ForwardMode.DECODE, 4))
    with pytest.raises(SplitError) as e:
        check_split(at)
    (v,) = e.value.violations
    assert (v.rule, v.node, v.origin) == ("buffer-capacity", pt.name, line_of("MARK-floor"))
    assert "width 4 holds 64 tokens" in v.message and "ceil(L/P) = 5" in v.fix
    ok = specialize_batch(g, PassContext(CompileOptions(max_bs=8, max_context_len=64), ForwardMode.DECODE, 4))
    check_split(ok)  # L a multiple of P: floor == ceil


def test_int32_indptr_overflow_at_max_capacity():
    """max_bs * L >= 2^31 with int32 indptrs: the prefix sum would wrap."""
    from attnmeta.backends import get_spec

    with pytest.raises(SplitError, match=r"\[buffer-capacity\] %kv_indptr .*int32 cumsum can reach 2147483648"):
        compile_backend(get_spec("flashinfer"), CompileOptions(max_bs=2048, capture_sizes=(8,),
                                                               max_context_len=2**20))
    compile_backend(get_spec("flashinfer"), CompileOptions(max_bs=2047, capture_sizes=(8,), max_context_len=2**20))
