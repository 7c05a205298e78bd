"""Bad input gets a clear error naming what is wrong and how to fix it."""

import pytest
import torch

from attnmeta.backends import get_spec
from attnmeta.compiler import CompileOptions, ForwardMode, OptionsError, compile_backend
from attnmeta.runtime import BatchError, ForwardBatch
from tests.batches import make_batch, make_pool

L, ROWS = 16, 8


@pytest.fixture(scope="module")
def backend():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L))
    return cb.instantiate(make_pool(ROWS, L))


def test_batch_larger_than_max_bs(backend):
    with pytest.raises(BatchError, match=r"batch size 5 exceeds max_bs=4.*--max-bs"):
        backend.init_forward_metadata(make_batch(5, L, ROWS, seed=0))


def test_sequence_longer_than_context(backend):
    fb = make_batch(2, L, ROWS, seed=0)
    fb.seq_lens_cpu[1] = L + 1
    with pytest.raises(BatchError, match=rf"a sequence of {L + 1} tokens exceeds {L}, .*max_context_len={L}\)"):
        backend.init_forward_metadata(fb)


@pytest.mark.parametrize(("name", "mode", "room"), [
    ("flashinfer", ForwardMode.TARGET_VERIFY, L - 4),  # keys: the prefix and the D = 4 drafts after it
    ("flashattention", ForwardMode.TARGET_VERIFY, L - 4),
    ("dsv4", ForwardMode.TARGET_VERIFY, L - 4),
    ("triton", ForwardMode.TARGET_VERIFY, L),  # keys: the prefix only, the drafts' K/V come separately
    ("flashattention_draft", ForwardMode.DECODE, L - 3),  # S = 3 drafted tokens
    ("tbo_flashinfer", ForwardMode.TARGET_VERIFY, L - 4),
])
def test_a_sequence_without_room_for_what_the_mode_reads_is_refused(name, mode, room):
    opts = CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L, num_draft_tokens=4, num_steps=3,
                          modes=(mode.name.lower(),))
    be = compile_backend(name, opts).instantiate(make_pool(ROWS, L), pools=extra_pools(name))
    fb = make_batch(2, L, ROWS, seed=0, mode=mode, max_len=2)
    fb.out_cache_loc = torch.arange(8)  # DSV4 verify: one slot per token
    fb.extend_seq_lens = fb.extend_seq_lens_cpu = torch.ones(2, dtype=torch.int32)
    fb.seq_lens_cpu[1] = room
    be.init_forward_metadata(fb)  # the longest it serves
    if room < L:
        fb.seq_lens_cpu[1] = room + 1
        with pytest.raises(BatchError, match=rf"exceeds {room}, .*max_context_len={L} less the {L - room} slots"):
            be.init_forward_metadata(fb)


def extra_pools(name):
    if name != "dsv4":
        return {}
    from attnmeta.backends.dsv4.eager import swa_table

    return {"full_to_swa": swa_table(ROWS * L + 1, "cpu")}


def test_missing_batch_field(backend):
    fb = make_batch(2, L, ROWS, seed=0)
    fb.req_pool_indices = fb.req_pool_indices_cpu = None
    with pytest.raises(BatchError, match=r"the batch has no req_pool_indices \(nor req_pool_indices_cpu\)"):
        backend.init_forward_metadata(fb)


def test_in_graph_without_out_graph(backend):
    fresh = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2,), max_context_len=L))
    be = fresh.instantiate(make_pool(ROWS, L))
    with pytest.raises(RuntimeError, match="before init_forward_metadata_out_graph"):
        be.init_forward_metadata_in_graph(ForwardBatch(ForwardMode.DECODE, 2))


def test_pool_of_wrong_width():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2,), max_context_len=L))
    with pytest.raises(BatchError, match=rf"pool req_to_token must be i32\[rows, {L}\] \(the L it was compiled"):
        cb.instantiate(torch.zeros(ROWS, L + 1, dtype=torch.int32))


def test_unsupported_mode_and_bad_options():
    with pytest.raises(OptionsError, match="does not support modes \\['mixed'\\]"):
        compile_backend("flashinfer", CompileOptions(modes=("mixed",)))
    with pytest.raises(OptionsError, match="capture sizes \\[300\\] are outside 1..max_bs=256"):
        CompileOptions(capture_sizes=(8, 300))
    with pytest.raises(OptionsError, match="page_size must be a power of two"):
        CompileOptions(page_size=3)
    with pytest.raises(ValueError, match="unknown forward mode 'decod'"):
        CompileOptions(modes=("decod",))
    with pytest.raises(KeyError, match=r"unknown backend 'flashinfr' \(did you mean 'flashinfer'\?\); available"):
        get_spec("flashinfr")


@pytest.mark.parametrize("live", [1, 48, 49, 200])
def test_the_length_check_sees_every_live_row(live):
    """Both ways of checking a slot (short batches in Python, long ones in NumPy) read exactly the live
    rows: the last live row is caught, a longer value past them is not looked at."""
    cb = compile_backend("flashinfer", CompileOptions(max_bs=256, capture_sizes=(256,), max_context_len=100))
    be = cb.instantiate(make_pool(257, 100))
    fb = make_batch(live, 100, 257, seed=live, max_len=100)
    fb.seq_lens_cpu = torch.cat([fb.seq_lens_cpu, torch.tensor([500], dtype=torch.int32)])
    be.init_forward_metadata(fb)  # the 500 is past the live rows
    fb.seq_lens_cpu[live - 1] = 101
    with pytest.raises(BatchError, match=rf"seq_lens_cpu\[{live - 1}\] = 101: a sequence of 101 tokens exceeds 100"):
        be.init_forward_metadata(fb)
