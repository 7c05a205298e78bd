"""pass-through: a device batch input exposed as a metadata field becomes an in_graph copy node, which fusion
stores from the kernel that already reads the input: one launch per step instead of a kernel and a copy."""

from attnmeta.backends import get_spec
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import DType, Kind, Op, Region, SpecBuilder
from attnmeta.compiler.passes.registry import PassContext
from attnmeta.compiler.pipeline import run_passes
from tests.batches import make_batch, make_pool

L, ROWS = 32, 12


def spec(mode, options):
    b = SpecBuilder("through")
    seq = b.input("seq_lens", DType.int32, ["bs"], fill=1, kind=Kind.length)
    rpi = b.input("req_pool_indices", DType.int64, ["bs"], fill=0, kind=Kind.row)
    pool = b.pool("req_to_token", DType.int32, ["R", "L"])
    with b.in_graph():
        indptr = b.cumsum(seq, name="kv_indptr")
        indices = b.ragged_gather(pool, rpi, seq, indptr, capacity="max_bs*L", name="kv_indices")
    b.outputs(kv_indptr=indptr, kv_indices=indices, cache_seqlens=seq, ragged={"kv_indices": "kv_indptr"})
    return b.build()


def test_the_field_reads_a_copy_node_in_the_graph():
    g = run_passes(spec(ForwardMode.DECODE, None), ["verify", "infer-shapes", "pass-through"],
                   PassContext(CompileOptions(), ForwardMode.DECODE, 4))
    out = {o.field: o.value for o in g.outputs}
    node = next(n for n in g.nodes if n.name == out["cache_seqlens"])
    assert (node.op, node.inputs, node.region) == (Op.copy, ("seq_lens",), Region.in_graph)
    assert out["kv_indptr"] == "kv_indptr"  # a computed field is left alone


def test_the_copy_is_fused_and_the_field_holds_the_batchs_lengths():
    from attnmeta.compiler import BackendSpec

    cb = compile_backend(BackendSpec("through", spec, (ForwardMode.DECODE,)),
                         CompileOptions(max_bs=8, capture_sizes=(4,), max_context_len=L))
    assert cb.kernels(ForwardMode.DECODE, 4) == 1  # the cumsum, the gather and the copy: one kernel
    be = cb.instantiate(make_pool(ROWS, L, seed=3))
    fb = make_batch(3, L, ROWS, seed=4)
    be.init_forward_metadata(fb)
    assert be.forward_metadata.cache_seqlens[:3].tolist() == fb.seq_lens_cpu.tolist()


def test_the_built_in_kinds_that_expose_a_length_launch_one_kernel():
    """FlashMLA's cache_seqlens, TRT-LLM MLA's seq_lens_k, FlashInfer MLA's kv_lens (decode): each was a
    fused kernel and a copy."""
    for name, page, field in (("flashmla", 64, "cache_seqlens"), ("trtllm_mla", 64, "seq_lens_k"),
                              ("flashinfer_mla", 1, "kv_lens")):
        cb = compile_backend(name, CompileOptions(max_bs=8, capture_sizes=(4,), max_context_len=256, page_size=page))
        assert cb.kernels(ForwardMode.DECODE, 4) == 1, name
        assert any(o.field == field for o in get_spec(name).build(ForwardMode.DECODE, cb.options).outputs)
