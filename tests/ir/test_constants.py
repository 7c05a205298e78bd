"""Graph.constants: what is evaluated once at bind instead of every step."""

from attnmeta.compiler.ir import DType, SpecBuilder


def test_constants_are_const_ops_and_what_only_they_feed():
    b = SpecBuilder("c")
    seq = b.input("seq_lens", DType.int32, ["bs"], fill=1)
    with b.in_graph():
        cols = b.arange("bs", name="cols")
        half = b.ewise("floordiv", cols, 2, name="half")  # arange // 2: fixed per size
        mask = b.full(1, ["bs"], DType.int32, name="mask")  # a field the engine may write into
        masked = b.ewise("mul", mask, half, name="masked")  # reads a field: must stay per step
        shifted = b.ewise("add", seq, half, name="shifted")  # reads the batch: per step
    b.outputs(mask=mask, masked=masked, shifted=shifted, half=half)
    g = b.build()
    assert g.constants() == ("cols", "half", "mask")
