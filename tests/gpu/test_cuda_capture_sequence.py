"""SGLang's capture sequence on the H200 (tests/runtime/capture_sequence.py with real CUDA graphs, each in a
memory pool of its own): the first replay, at batch size 1, raises no false BatchError (the device check's
record is zeroed when made and written only by the check), every replay reads the live batch from the
runner's buffers, and a bad row in them is raised by the next step."""

import pytest
import torch

from attnmeta.runtime import BatchError
from tests.runtime.capture_sequence import ROWS, capture_like_sglang, serve_replayed

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_replays_after_sglangs_capture_sequence_are_right_and_raise_nothing(name):
    serve_replayed(name, "cuda", steps=40)


def test_a_bad_row_in_the_engines_buffers_is_raised_by_the_next_step():
    be, reg, graphs, pool, _ = capture_like_sglang("triton", "cuda")
    be.init_forward_metadata_out_graph(reg.load([3, ROWS + 5], [10, 12], 2))
    graphs[2].replay()
    torch.cuda.synchronize()
    assert be.forward_metadata.kv_indices[10:22].tolist() == pool[0, :12].tolist()
    with pytest.raises(BatchError, match=rf"req_pool_indices\[1\] = {ROWS + 5} from the device"):
        be.init_forward_metadata_out_graph(reg.load([3, 4], [10, 12], 2))
    be.init_forward_metadata_out_graph(reg.load([3, 4], [10, 12], 2))
    graphs[2].replay()
    torch.cuda.synchronize()
    assert be.forward_metadata.kv_indices[10:22].tolist() == pool[4, :12].tolist()
