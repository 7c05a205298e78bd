"""Every op: its lowering kernel equals its reference implementation, and
the indexing ops match hand-computed cases."""

import pytest
import torch

from attnmeta.compiler.ir import OPS, DType, Op, Placement, SpecBuilder, eval_graph
from attnmeta.compiler.lowering.kernels import KERNELS, kernel_kwargs

T = torch.tensor


def i32(*xs):
    return T(list(xs), dtype=torch.int32)


CASES = {
    Op.cumsum: ([i32(3, 1, 4)], {"leading_zero": True}),
    Op.cast: ([i32(3, -1)], {"dtype": DType.int64}),
    Op.ewise: ([i32(7, 8), i32(2, 3)], {"fn": "floordiv"}),
    Op.ewise_const: ([i32(7, -8)], {"fn": "floordiv", "value": 4}),
    "ewise_const_min": ([i32(7, -8)], {"fn": "min", "value": 2}),
    "ewise_const_max": ([i32(7, -8)], {"fn": "max", "value": 2}),
    Op.reduce: ([i32(5, 9, 2)], {"fn": "max"}),
    Op.slice: ([i32(1, 2, 3, 4)], {"start": 1, "stop": 3}),
    Op.compare: ([i32(1, 5, 3), i32(3, 3, 3)], {"fn": "ge"}),
    Op.where: ([T([True, False]), i32(1, 2), i32(9, 9)], {}),
    Op.repeat: ([i32(4, 7)], {"times": 3}),
    Op.lookup: ([i32(10, 20, 30, 40), i32(3, 0, 2)], {}),
    Op.sort_rows: ([i32(3, 1, 2, 9, 0, 5).view(2, 3)], {}),
    Op.reduce_rows: ([i32(3, 1, 2, 9, 0, 5).view(2, 3)], {"fn": "sum"}),
    Op.copy: ([i32(1, 2)], {}),
    Op.clamp: ([i32(-3, 4, 99)], {"lo": 1, "hi": 8}),
    Op.log2_scale: ([i32(0, 64, 256, 300, 4096)], {"scale": 132, "divisor": 64}),
    Op.outer: ([i32(5, 9), i32(0, 1, 2)], {"fn": "sub"}),
    Op.flatten: ([i32(1, 2, 3, 4, 5, 6).view(2, 3)], {}),
    Op.gather_rows: ([torch.arange(8, dtype=torch.int32).view(2, 4), T([1, 0]), i32(0, 3, -1, 4).view(2, 2)], {}),
    "ewise_mod": ([i32(7, -7)], {"fn": "mod", "value": 4}),
    Op.ragged_gather: ([torch.arange(12, dtype=torch.int32).view(3, 4), T([2, 0]), i32(3, 1), i32(0, 3, 4)],
                       {"capacity": 8}),
    Op.page_table: ([torch.arange(16, dtype=torch.int32).view(2, 8) * 1, T([1, 0]), i32(5, 8)],
                    {"page_size": 2, "width": 4}),
}


@pytest.mark.parametrize("case", list(CASES), ids=[getattr(o, "value", o) for o in CASES])
def test_kernel_matches_reference(case):
    ins, a = CASES[case]
    op = case if isinstance(case, Op) else Op.ewise_const  # the string cases are ewise_const variants
    ref = OPS[op].ref(ins, a)
    from attnmeta.compiler.ir import Node, Region, TensorType

    node = Node("n", op, (), a, TensorType(DType.int32, ()), Region.in_graph)
    got = KERNELS[op](*ins, **kernel_kwargs(node))
    if op is Op.ragged_gather:  # the tail past indptr[-1] is unspecified
        ref, got = ref[:4], got[:4]
    assert torch.equal(got, ref)


def test_page_table_hand_computed():
    table = torch.arange(16, dtype=torch.int32).view(2, 8)  # row 1 = slots 8..15
    out = OPS[Op.page_table].ref([table, T([1, 0]), i32(5, 8)], {"page_size": 2, "width": 5})
    # row 0 reads pool row 1: ceil(5/2) = 3 pages, slots 8, 10, 12 -> pages 4, 5, 6; the rest 0
    assert out.tolist() == [[4, 5, 6, 0, 0], [0, 1, 2, 3, 0]]


def test_clamp_hand_computed():
    assert OPS[Op.clamp].ref([i32(-3, 4, 99)], {"lo": 1, "hi": 8}).tolist() == [1, 4, 8]


def test_log2_scale_hand_computed():
    # 132 SMs: up to 128 tokens the term is 132 (log2 <= 1); 256 -> 2*132; 4096 -> 6*132;
    # 300 -> int(132 * log2(300/64)) = int(132 * 2.2288) = 294
    out = OPS[Op.log2_scale].ref([i32(0, 64, 128, 256, 300, 4096)], {"scale": 132, "divisor": 64})
    assert out.tolist() == [132, 132, 132, 264, 294, 792] and out.dtype == torch.int32


def test_every_op_has_a_kernel_and_a_case_or_its_own_test():
    tested_elsewhere = {Op.full, Op.arange, Op.item, Op.to_host, Op.to_device, Op.nonzero, Op.host_call, Op.split_at,
                        Op.ingest}  # ingest: tests/runtime/test_ingest.py, by hand through kernel, twin and reference
    assert set(OPS) == {c for c in CASES if isinstance(c, Op)} | tested_elsewhere
    assert set(KERNELS) == set(OPS)


def test_builder_sugar_evaluates():
    b = SpecBuilder("s")
    x = b.input("x", DType.int32, ["bs"], fill=1)
    with b.in_graph():
        big = b.compare("gt", x, 2)
        y = b.where(big, x, 0)
        r = b.repeat(y, 2)
        s = b.slice(r, 1, "2*bs")
    with b.out_graph():
        h = b.input("h", DType.int32, ["bs"], Placement.host, fill=1)
    b.outputs(s=s, h=h)
    from attnmeta.compiler import CompileOptions, ForwardMode
    from attnmeta.compiler.passes.registry import PassContext
    from attnmeta.compiler.passes.specialize_batch import specialize_batch

    g = specialize_batch(b.build(), PassContext(CompileOptions(), ForwardMode.DECODE, 3))
    out = eval_graph(g, {"x": i32(1, 3, 5), "h": i32(0, 0, 0)})
    assert out["s"].tolist() == [0, 3, 3, 5, 5]


def test_gather_rows_and_outer_hand_computed():
    table = torch.arange(8, dtype=torch.int32).view(2, 4)  # row 1 = 4 5 6 7
    got = OPS[Op.gather_rows].ref([table, T([1, 0]), i32(0, 3, -1, 4).view(2, 2)], {})
    assert got.tolist() == [[4, 7], [-1, -1]]  # -1 and 4 are outside a row of 4
    assert OPS[Op.outer].ref([i32(5, 9), i32(0, 1, 2)], {"fn": "sub"}).tolist() == [[5, 4, 3], [9, 8, 7]]
    assert OPS[Op.outer].ref([i32(1, 3), i32(2)], {"fn": "gt"}).tolist() == [[False], [True]]
    assert OPS[Op.ewise_const].ref([i32(7, -7)], {"fn": "mod", "value": 4}).tolist() == [3, 1]


def _gather(impl, ins, capacity=8):
    from attnmeta.compiler.lowering import triton_kernels

    if impl == "reference":
        return OPS[Op.ragged_gather].ref(ins, {"capacity": capacity})
    old, triton_kernels.CPU_KERNELS = triton_kernels.CPU_KERNELS, impl
    try:
        return triton_kernels.ragged_gather(*ins[:4], torch.zeros(capacity, dtype=torch.int32), *ins[4:])
    finally:
        triton_kernels.CPU_KERNELS = old


@pytest.mark.parametrize("impl", ["reference", "triton", "torch"])
def test_ragged_gather_jump_hand_computed(impl):
    """With (split, shift) entries from split on read shift columns further: a draft branch's slots."""
    table = torch.arange(24, dtype=torch.int32).view(2, 12)  # row 1 = slots 12..23
    out = _gather(impl, [table, T([1, 0]), i32(4, 3), i32(0, 4, 7), i32(2, 3), i32(5, 9)])
    # row 0 reads pool row 1 at columns 0, 1, then 2+5, 3+5; row 1 never reaches its split (3)
    assert out[:7].tolist() == [12, 13, 19, 20, 0, 1, 2]


@pytest.mark.parametrize("impl", ["reference", "triton", "torch"])
def test_ragged_gather_two_jumps_hand_computed(impl):
    """Two (split, shift) pairs add up: a window starting at column 3 (split 0, shift 3) whose entries from 2 on
    jump 4 more (a branch's drafts past its prefix); a split below 0 shifts every entry."""
    table = torch.arange(24, dtype=torch.int32).view(2, 12)  # row 1 = slots 12..23
    out = _gather(impl, [table, T([1, 0]), i32(4, 2), i32(0, 4, 6), i32(0, 0), i32(3, 1), i32(2, -1), i32(4, 6)])
    # row 0: columns 3, 4, then 5+4, 6+4; row 1: columns 0+1+6, 1+1+6
    assert out[:6].tolist() == [15, 16, 21, 22, 7, 8]


def test_ragged_gather_takes_zero_one_or_two_jumps():
    from attnmeta.compiler.ir.errors import ShapeError
    from attnmeta.compiler.ir.types import TensorType

    t = TensorType(DType.int32, (2, 12), Placement.device)
    v = TensorType(DType.int32, (2,), Placement.device)
    with pytest.raises(ShapeError, match="split2, shift2"):
        OPS[Op.ragged_gather].infer([t, v, v, v, v], {"capacity": 8})
