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


def test_missing_batch_field(backend):
    fb = make_batch(2, L, ROWS, seed=0)
    fb.req_pool_indices = None
    with pytest.raises(BatchError, match="the batch has no req_pool_indices"):
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
    with pytest.raises(KeyError, match="unknown backend 'flashinfr'; available"):
        get_spec("flashinfr")
