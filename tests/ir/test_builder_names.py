"""Values are named after what the spec assigns them to, so reports and dumps read as the spec does."""

from attnmeta.compiler.ir import DType, SpecBuilder

I32 = DType.int32


def test_a_value_is_named_after_its_variable_and_kept_unique():
    b = SpecBuilder("t")
    seq = b.input("seq_lens", I32, ["bs"], fill=1)
    with b.in_graph():
        kv_indptr = b.cumsum(seq)
        nested = b.cast(b.cumsum(seq), I32)  # two calls on the line: the variable names neither
        kv_indptr_again = b.cumsum(seq, name="mine")
        seq_lens = b.cumsum(seq)  # the name is taken (an input): a suffix
        kv_indptr2 = kv_indptr
        kv_indptr = b.cumsum(seq)  # reassigned: the name is taken by the first
    assert kv_indptr2.name == "kv_indptr" and kv_indptr.name == "kv_indptr_1"
    assert nested.name.startswith("v") and kv_indptr_again.name == "mine" and seq_lens.name == "seq_lens_1"
    b.outputs(kv_indptr=kv_indptr2, other=nested, mine=kv_indptr_again, a=seq_lens, b=kv_indptr)
    b.build()
