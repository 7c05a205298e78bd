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


def test_ops_over_zero_rows_are_constants():
    """A zero-size TBO child reads no batch data: its indptr, indices and sums are fixed, even the
    gather from the pool (no row of it is read). What mixes in real rows is not."""
    b = SpecBuilder("z")
    seq = b.input("seq_lens", DType.int32, ["bs"], fill=1)
    rpi = b.input("req_pool_indices", DType.int64, ["bs"], fill=0)
    r2t = b.pool("req_to_token", DType.int32, ["R", "L"])
    with b.in_graph():
        none, rows = b.slice(seq, 0, 0, name="none"), b.slice(rpi, 0, 0, name="rows")
        ind = b.cumsum(none, name="ind")
        idx = b.ragged_gather(r2t, rows, none, ind, capacity="L", name="idx")
        n = b.reduce("sum", none, name="n")
        live = b.ewise("add", b.reduce("sum", seq, name="total"), n, name="live")
    b.outputs(ind=ind, idx=idx, live=live)
    assert b.build().constants() == ("ind", "idx", "n")
