"""Bad batches are refused at the boundary with a BatchError that names the field, the row, the
value and the limit, before anything runs, and the backend serves the next good batch. Values the
host never sees are guarded on the device: an index outside its table reads the reserved entry 0
and no write lands outside its buffer, so even garbage in the static buffers cannot reach memory
a kernel does not own."""

import pytest
import torch

from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.compiler.lowering.binding import ArgKind
from attnmeta.runtime import BatchError, ForwardBatch, ReplayView
from tests.batches import capture, make_batch, make_pool
from tests.engine import padded_inputs

L, ROWS, BS = 16, 8, 4


@pytest.fixture(scope="module")
def compiled():
    return compile_backend("flashinfer", CompileOptions(max_bs=BS, capture_sizes=(BS,), max_context_len=L,
                                                        modes=("decode", "target_verify", "draft_extend")))


def good(seed=0, raw=3):
    return make_batch(raw, L, ROWS, seed=seed, max_len=8)


def _serves_next(be, compiled):
    fb = good(seed=9)
    be.init_forward_metadata(fb)
    want = eval_graph(compiled.plan(ForwardMode.DECODE, 3).graph, padded_inputs(
        compiled.plan(ForwardMode.DECODE, 3).graph, fb, 3, {"req_to_token": be.pools["req_to_token"]}))
    assert torch.equal(be.forward_metadata.kv_indptr, want["kv_indptr"])


@pytest.mark.parametrize(("field", "row", "value", "match"), [
    ("req_pool_indices_cpu", 1, -1, r"req_pool_indices_cpu\[1\] = -1 is not a request row of this pool: allowed 1..7"),
    ("req_pool_indices_cpu", 2, ROWS, r"req_pool_indices_cpu\[2\] = 8 is not a request row.*allowed 1..7"),
    ("req_pool_indices_cpu", 0, 10**9, r"req_pool_indices_cpu\[0\] = 1000000000 is not a request row"),
    ("req_pool_indices_cpu", 0, 0, r"req_pool_indices_cpu\[0\] = 0 is not a request row.*row 0 is reserved"),
    ("seq_lens_cpu", 2, -3, r"seq_lens_cpu\[2\] = -3: a length cannot be negative"),
    ("seq_lens_cpu", 0, L + 1, rf"seq_lens_cpu\[0\] = 17: a sequence of 17 tokens exceeds {L}"),
    ("seq_lens_cpu", 1, 2**32 + 5, r"seq_lens_cpu\[1\] = 4294967301: a sequence of 4294967301 tokens exceeds 16"),
])
def test_out_of_range_values_are_refused_and_the_next_batch_served(compiled, field, row, value, match):
    be = compiled.instantiate(make_pool(ROWS, L))
    fb = good()
    t = getattr(fb, field).to(torch.int64).clone()  # int64: a value past 2^32 must not wrap into range
    t[row] = value
    setattr(fb, field, t)
    with pytest.raises(BatchError, match=match):
        be.init_forward_metadata(fb)
    _serves_next(be, compiled)


def test_a_refused_batch_leaves_no_rows_behind_as_padding(compiled):
    """A batch refused at its third row has had its first rows staged: a smaller batch padded to the same size
    next must read the fill in its padding rows, not the refused batch's rows (a stale row there reads
    another request's keys)."""
    be = compiled.instantiate(make_pool(ROWS, L))
    one = good(seed=4, raw=1)
    be.init_forward_metadata(one)  # the rows past the first now hold the fill: nothing to pad next time
    fb = good(raw=BS)
    rows = fb.req_pool_indices_cpu.to(torch.int64).clone()
    rows[BS - 1] = ROWS  # refused at the last row, after the others were staged
    fb.req_pool_indices_cpu = rows
    with pytest.raises(BatchError, match="is not a request row"):
        be.init_forward_metadata(fb)
    view = ReplayView(BS, ForwardMode.DECODE, ForwardMode.DECODE, 1, req_pool_indices=one.req_pool_indices,
                      req_pool_indices_cpu=one.req_pool_indices_cpu, seq_lens=one.seq_lens,
                      seq_lens_cpu=one.seq_lens_cpu)
    be.init_forward_metadata(view)
    g = compiled.plan(ForwardMode.DECODE, BS).graph
    want = eval_graph(g, padded_inputs(g, one, BS, {"req_to_token": be.pools["req_to_token"]}))
    n = int(want["kv_indptr"][-1])
    assert torch.equal(be.forward_metadata.kv_indptr, want["kv_indptr"])
    assert torch.equal(be.forward_metadata.kv_indices[:n], want["kv_indices"][:n])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool])
def test_float_nan_and_bool_lengths_are_refused(compiled, dtype):
    be = compiled.instantiate(make_pool(ROWS, L))
    fb = good()
    fb.seq_lens_cpu = torch.tensor([3.0, float("nan"), 2.5]).to(dtype)
    with pytest.raises(BatchError, match=rf"seq_lens_cpu must hold integers .* got {dtype}"):
        be.init_forward_metadata(fb)
    _serves_next(be, compiled)


def test_a_device_only_length_is_checked_too(compiled):
    """The length check used to run only with a host mirror: seq_lens of 16000 at L = 16 wrote far
    past kv_indices. Without the mirror, a host seq_lens is read and checked in its place."""
    be = compiled.instantiate(make_pool(ROWS, L))
    fb = good()
    fb.seq_lens_cpu = None
    fb.seq_lens = torch.tensor([2, 16000, 3], dtype=torch.int32)
    with pytest.raises(BatchError, match=r"seq_lens\[1\] = 16000: a sequence of 16000 tokens exceeds 16"):
        be.init_forward_metadata(fb)
    _serves_next(be, compiled)


def test_inconsistent_sizes_and_modes_are_refused(compiled):
    be = compiled.instantiate(make_pool(ROWS, L))
    fb = good(raw=3)
    fb.req_pool_indices_cpu = fb.req_pool_indices_cpu[:2]
    with pytest.raises(BatchError, match="req_pool_indices_cpu has 2 values for a batch of 3 rows"):
        be.init_forward_metadata(fb)
    with pytest.raises(BatchError, match="the batch has 3 live rows for a padded size of 2"):
        be.init_forward_metadata_out_graph(ReplayView.of(good(raw=3), 2))
    with pytest.raises(BatchError, match="batch size 9 exceeds max_bs=4"):
        be.init_forward_metadata(make_batch(9, L, 12, seed=0, max_len=4))
    idle_only = compile_backend("triton", CompileOptions(max_bs=BS, capture_sizes=(BS,), max_context_len=L))
    with pytest.raises(BatchError, match=r"compiled for modes \['decode'\], not target_verify"):
        idle_only.instantiate(make_pool(ROWS, L)).init_forward_metadata(good().__class__(
            ForwardMode.TARGET_VERIFY, 2, seq_lens=torch.ones(2, dtype=torch.int32)))
    _serves_next(be, compiled)


def test_draft_extend_lengths_are_bounded_by_the_draft_tokens():
    """A spec that reads the accepted lengths (flashattention's cu_seqlens_q) bounds them by D."""
    fa = compile_backend("flashattention", CompileOptions(max_bs=BS, capture_sizes=(BS,), max_context_len=L,
                                                          modes=("decode", "draft_extend")))
    be = fa.instantiate(make_pool(ROWS, L))
    fb = good()
    fb.forward_mode = ForwardMode.DRAFT_EXTEND
    fb.extend_seq_lens_cpu = torch.tensor([1, 5, 2], dtype=torch.int32)
    with pytest.raises(BatchError, match=r"extend_seq_lens_cpu\[1\] = 5: a sequence of 5 tokens exceeds 4, "
                                         r".*num_draft_tokens=4.*--num-draft-tokens"):
        be.init_forward_metadata(fb)


def test_capture_may_use_the_reserved_row(compiled):
    """Engines capture from dummy batches of pool row 0; only live serving batches must not use it."""
    be = compiled.instantiate(make_pool(ROWS, L))
    fb = make_batch(BS, L, ROWS, seed=0, max_len=2)
    fb.req_pool_indices_cpu = torch.zeros(BS, dtype=torch.int64)
    capture(be, fb)
    with pytest.raises(BatchError, match="row 0 is reserved"):
        be.init_forward_metadata_out_graph(ReplayView.of(fb, BS))


def _garbage(be, mode, bs, values: dict):
    """Write values straight into a plan's staging buffer, past every host check, as a bug or an
    unchecked device field would, then run the plan's device work."""
    b = be.bound(mode, bs)
    for s in b.stager.slots:
        if s.source in values:
            v = torch.as_tensor(values[s.source], dtype=s.host.dtype)
            s.host[: v.numel()].copy_(v)
            (s.dev if s.dev is not None else s.host)[: v.numel()].copy_(v)
    for a, t in zip(b.binding.in_args, b.in_args, strict=True):  # and the size it staged for, as out_graph writes
        if a.kind is ArgKind.generation:
            t.fill_(bs)  # (its size, the graph's that pads it): a captured size, both
    be._current = b
    be.init_forward_metadata_in_graph(ForwardBatch(mode, bs))
    return b.meta


@pytest.mark.parametrize("name", ["flashinfer", "triton", "flashattention"])
def test_kernels_guard_every_index_on_device(name):
    """Rows outside the pool read row 0, lengths past the row read zeros, negative lengths read
    nothing, and kv_indices is never written past its end: equal to the guarded reference."""
    cb = compile_backend(name, CompileOptions(max_bs=BS, capture_sizes=(BS,), max_context_len=L, page_size=1))
    pool = make_pool(ROWS, L)
    be = cb.instantiate(pool)
    bad = {"req_pool_indices_cpu": [-5, 10**6, 3, 2], "seq_lens_cpu": [3, 16000, -4, 5]}
    meta = _garbage(be, ForwardMode.DECODE, BS, bad)
    g = cb.plan(ForwardMode.DECODE, BS).graph
    ins = {"req_to_token": pool, "seq_lens": torch.tensor(bad["seq_lens_cpu"], dtype=torch.int32),
           "seq_lens_cpu": torch.tensor(bad["seq_lens_cpu"], dtype=torch.int32),
           "req_pool_indices": torch.tensor(bad["req_pool_indices_cpu"])}
    want = eval_graph(g, ins)
    for field, w in want.items():
        if isinstance(w, torch.Tensor) and field != "kv_indptr_host":
            assert torch.equal(getattr(meta, field).cpu(), w), field


def test_dsv4_device_only_slots_are_guarded():
    """out_cache_loc exists only on the device in engines: never checked on the host on a GPU, so
    the lookup through full_to_swa guards it (outside the table reads slot 0)."""
    L2 = 600
    cb = compile_backend("dsv4", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=L2))
    pool, f2s = make_pool(ROWS, L2), swa_table(ROWS * L2 + 1, "cpu")
    be = cb.instantiate(pool, pools={"full_to_swa": f2s})
    meta = _garbage(be, ForwardMode.DECODE, 2, {"seq_lens_cpu": [5, 300], "req_pool_indices_cpu": [1, 2],
                                                "out_cache_loc": [-7, 10**12]})
    assert meta.swa_out_cache_loc.tolist() == [int(f2s[0]), int(f2s[0])]
    fb = make_batch(2, L2, ROWS, seed=0)  # and on the host (a CPU tensor), it is checked
    fb.out_cache_loc = torch.tensor([3, ROWS * L2 + 1])  # the slot table has ROWS * L2 + 1 = 4801 entries
    with pytest.raises(BatchError, match=r"out_cache_loc\[1\] = 4801 is not a KV slot of this pool: allowed 0..4800"):
        be.init_forward_metadata(fb)


def test_a_negative_live_row_count_is_refused_not_a_crash():
    """An engine's num_padding larger than its batch_size (a negative live-row count) used to reach a
    negative-length copy; it is a BatchError naming both numbers."""
    cb = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=64))
    be = cb.instantiate(torch.zeros(5, 64, dtype=torch.int32))
    seq, rpi = torch.ones(4, dtype=torch.int32), torch.ones(4, dtype=torch.int64)
    fb = ReplayView(4, ForwardMode.DECODE, ForwardMode.DECODE, -1, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                    seq_lens=seq, seq_lens_cpu=seq)
    with pytest.raises(BatchError, match="the batch has -1 live rows for a padded size of 4"):
        be.init_forward_metadata_out_graph(fb)
