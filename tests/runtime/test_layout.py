"""The static layout: no two live values share memory, within a mode or across modes, and no
size's constant leaks into another size's plan. Each case was silently wrong before."""

import pytest
import torch

from attnmeta.backends import get_spec
from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import VerifyError, parse, verify
from attnmeta.runtime import ForwardBatch
from tests.batches import make_batch, make_pool

V, D = ForwardMode.TARGET_VERIFY, ForwardMode.DECODE


def _spans(meta) -> list[tuple[int, int, str]]:
    out = []
    for f, t in vars(meta).items():
        if isinstance(t, torch.Tensor) and t.numel():
            start = t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()
            out.append((start, start + t.numel() * t.element_size(), f"{f}@{t.device.type}"))
    return out


def _assert_disjoint(spans) -> None:
    spans = sorted(spans)
    for (a0, a1, fa), (b0, b1, fb) in zip(spans, spans[1:], strict=False):
        assert b0 >= a1, f"{fa} [{a0}, {a1}) and {fb} [{b0}, {b1}) share memory"


def test_the_issue_example_verify_after_decode():
    """flashinfer with decode and target_verify: qo_indptr used to share kv_indptr's storage."""
    pool = make_pool(6, 32)
    be = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=32,
                                                      modes=("decode", "target_verify"))).instantiate(pool)
    seq = torch.tensor([5, 9, 3, 7], dtype=torch.int32)
    fb = ForwardBatch(V, 4, req_pool_indices=torch.tensor([1, 2, 3, 4]), seq_lens=seq, seq_lens_cpu=seq.clone())
    be.init_forward_metadata(fb)
    m = be.forward_metadata
    assert m.qo_indptr.tolist() == [0, 4, 8, 12, 16]  # D = 4 query tokens per request, hand-computed
    assert m.kv_indptr.tolist() == [0, 9, 22, 29, 40]  # seq + D keys each
    assert m.mask_indptr.tolist() == [0, 36, 88, 116, 160]


@pytest.mark.parametrize("name", ["flashinfer", "triton", "flashattention", "dsv4", "tbo_flashinfer",
                                  "tbo_triton", "tbo_flashattention"])
def test_no_two_fields_share_memory_in_any_mode_or_size(name):
    spec = get_spec(name)
    modes = tuple(m.name.lower() for m in spec.modes if m is not ForwardMode.EXTEND)
    cb = compile_backend(name, CompileOptions(max_bs=6, capture_sizes=(1, 3, 6), max_context_len=512, modes=modes))
    pools = {"full_to_swa": swa_table(8 * 512 + 1, "cpu")} if name == "dsv4" else {}
    be = cb.instantiate(make_pool(8, 512), pools=pools)
    spans = []
    for mode in cb.generic:
        per_mode = []
        for bs in (1, 3, 6):
            per_mode = _spans(be.bound(mode, bs).meta)
            _assert_disjoint(per_mode)  # within one plan
        spans += per_mode  # the largest plan of each mode: modes never overlap
    _assert_disjoint(spans)


def test_dsv4_decode_and_verify_in_one_backend():
    """Used to fail with a shape error: verify's per-token fields were laid over decode's."""
    L, rows = 600, 8
    cb = compile_backend("dsv4", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L, num_draft_tokens=2,
                                                modes=("decode", "target_verify")))
    be = cb.instantiate(make_pool(rows, L), pools={"full_to_swa": swa_table(rows * L + 1, "cpu")})
    for mode, per in ((D, 1), (V, 2), (D, 1)):
        fb = make_batch(3, L, rows, seed=per, mode=mode, max_len=L - 2)
        fb.out_cache_loc = torch.arange(1, 3 * per + 1)
        be.init_forward_metadata(fb)
        assert be.forward_metadata.positions.shape == (3 * per,)
        want = (fb.seq_lens_cpu - 1).long() if mode is D else (fb.seq_lens_cpu[:, None] + torch.arange(2)).reshape(-1)
        assert be.forward_metadata.positions.tolist() == want.tolist()


def test_a_per_size_constant_does_not_leak_into_another_size():
    """TBO's split point is a constant of each size: bs 4 bound after bs 8 used to read 8's split."""
    be = compile_backend("tbo_triton", CompileOptions(max_bs=8, capture_sizes=(4, 8), max_context_len=32)
                         ).instantiate(make_pool(20, 32))
    for bs, (c0, c1) in ((8, (4, 4)), (4, (2, 2)), (8, (4, 4)), (3, (1, 2))):
        be.init_forward_metadata(make_batch(bs, 32, 20, seed=bs))
        m = be.forward_metadata
        assert (int(m.tbo0_num_token_non_padded), int(m.tbo1_num_token_non_padded)) == (c0, c1)


def test_a_value_derived_from_a_per_size_constant_is_per_size_too():
    """A scalar of a bs-long constant (a launch grid of bs * blocks) has a bs-free shape but a
    bs-dependent value: an op over it used to be taken for a constant shared by every size."""
    from attnmeta.compiler import BackendSpec, ForwardMode
    from attnmeta.compiler.ir import DType, SpecBuilder

    def build(mode, options):
        b = SpecBuilder("grid")
        seq = b.input("seq_lens", DType.int32, ["bs"], fill=1, mirror="seq_lens_cpu")
        with b.in_graph():
            grid = b.ewise("max", b.reduce("sum", b.full(3, ["bs"], DType.int32)), 1)
            per = b.ewise("ceildiv", b.ewise("add", seq, 0), grid)
        b.outputs(grid=grid, per=per)
        return b.build()

    opts = CompileOptions(max_bs=8, capture_sizes=(2, 8), max_context_len=32)
    be = compile_backend(BackendSpec("grid", build, (ForwardMode.DECODE,)), opts).instantiate(make_pool(20, 32))
    for bs in (8, 2, 5, 8):
        be.init_forward_metadata(make_batch(bs, 32, 20, seed=bs))
        assert int(be.forward_metadata.grid) == 3 * bs


def test_the_verifier_rejects_overlapping_buffers():
    text = """graph "g" [] {
  input %seq_lens: i32[bs]@device batch fill=1
  %a = cumsum(%seq_lens) {leading_zero=true} : i32[bs + 1]@device in_graph
  %b = ewise_const(%seq_lens) {fn="add", value=1} : i32[bs]@device in_graph
  output a = %a
  output b = %b
  buffer arena field a [%a] offset=0 bytes=36
  buffer arena field b [%b] offset=32 bytes=32
}"""
    with pytest.raises(VerifyError, match=r"arena buffers field a \[0, 36\) and field b \[32, 64\) overlap"):
        verify(parse(text))
    verify(parse(text.replace("offset=32", "offset=48")))  # apart: fine
