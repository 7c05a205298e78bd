"""SGLang's capture sequence (tests/runtime/capture_sequence.py) on the emulated graph: the first replay after
it raises nothing (every record the device check reads is written before it is read), each replay on the
runner's buffers runs no host work and reads the live batch, and a bad value in those buffers is replaced on
the device and raised by the next step."""

import pytest
import torch

from attnmeta.runtime import BatchError
from tests.runtime.capture_sequence import ROWS, capture_like_sglang, serve_replayed


@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_replays_after_sglangs_capture_sequence_are_right_and_raise_nothing(name):
    serve_replayed(name, "cpu")


@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_a_captured_step_is_one_launch(name):
    """The device checks of the engine's buffers (and of a staged step's device-only fields) run inside the
    step's fused metadata kernel: one graph node per step, not a check kernel before it (the tests around
    this one show the checks still replace and report bad values)."""
    _, _, graphs, _, _ = capture_like_sglang(name, "cpu")
    assert {bs: g.num_ops for bs, g in graphs.items()} == {bs: 1 for bs in graphs}


def test_a_bad_row_in_the_engines_buffers_is_raised_by_the_next_step():
    be, reg, graphs, pool, _ = capture_like_sglang("triton", "cpu")
    be.init_forward_metadata_out_graph(reg.load([3, ROWS + 5], [10, 12], 2))
    graphs[2].replay()  # the row past the pool reads row 0 (reserved) on the device; nothing raised yet
    assert be.forward_metadata.kv_indices[10:22].tolist() == pool[0, :12].tolist()
    with pytest.raises(BatchError, match=rf"req_pool_indices\[1\] = {ROWS + 5} from the device"):
        be.init_forward_metadata_out_graph(reg.load([3, 4], [10, 12], 2))
    be.init_forward_metadata_out_graph(reg.load([3, 4], [10, 12], 2))  # reported once; the next step serves
    graphs[2].replay()
    assert be.forward_metadata.kv_indices[10:22].tolist() == pool[4, :12].tolist()


def test_a_length_past_the_context_in_the_engines_buffers_is_clamped_and_raised_next():
    be, reg, graphs, pool, opts = capture_like_sglang("triton", "cpu")
    be.init_forward_metadata_out_graph(reg.load([3], [opts.max_context_len + 50], 1))
    graphs[1].replay()
    assert int(be.forward_metadata.kv_indptr[1]) <= opts.max_context_len
    with pytest.raises(BatchError, match=r"seq_lens\[0\] = 306 from the device"):
        be.init_forward_metadata_out_graph(reg.load([3], [5], 1))


def test_no_aten_op_on_a_replayed_step():
    from torch.profiler import ProfilerActivity, profile

    be, reg, graphs, _, _ = capture_like_sglang("triton", "cpu")
    v = reg.load([3, 4, 5], [7, 8, 9], 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        be.init_forward_metadata_out_graph(v)
    assert [e.name for e in prof.events() if e.name.startswith("aten::")] == []
    graphs[4].replay()
    assert be.forward_metadata.kv_indptr[:4].tolist() == [0, 7, 15, 24]


def test_a_host_field_computed_by_out_graph_stays_fresh_on_replays():
    """A spec whose out_graph computes a host value (examples/mine.py's kv_indptr_host) keeps its host work on
    replays over the engine's buffers: the field follows every batch, it is never the capture batch's."""
    import os

    mine = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                        "mine.py") + ":SPEC"
    be, reg, graphs, _, _ = capture_like_sglang(mine, "cpu")
    for rows, seq in (([3, 4], [7, 9]), ([5], [11])):
        bs = 2 if len(rows) == 2 else 1
        be.init_forward_metadata_out_graph(reg.load(rows, seq, bs))
        graphs[bs].replay()
        want = [0, *torch.tensor(seq).cumsum(0).tolist()]
        assert be.forward_metadata.kv_indptr_host[: len(rows) + 1].tolist() == want


def test_a_view_shorter_than_the_graph_reads_is_staged_and_the_next_backed_step_replays_again():
    """A view at the captured buffers' address but shorter than the rows the graph reads is not the engine's
    replay view: it is staged (host work, the graph reads what was staged); the next view of the whole
    buffers is replayed in place again, and the graph reads the engine's values, not the staged ones."""
    from torch.profiler import ProfilerActivity, profile

    def ops(v) -> list[str]:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            be.init_forward_metadata_out_graph(v)
        return [e.name for e in prof.events() if e.name.startswith("aten::")]

    be, reg, graphs, _, _ = capture_like_sglang("triton", "cpu")
    short = reg.load([3, 4], [7, 9], 2)
    short.seq_lens = short.seq_lens[:1]  # same data pointer, one row: the host mirror still has both
    assert len(ops(short)) > 1
    graphs[2].replay()
    assert be.forward_metadata.kv_indptr[:3].tolist() == [0, 7, 16]
    # the path changed back: the device word is written once (the graph's ingest reads the engine's buffers)
    assert ops(reg.load([5, 6], [4, 30], 2)) == ["aten::fill_"]
    graphs[2].replay()
    assert be.forward_metadata.kv_indptr[:3].tolist() == [0, 4, 34]
    assert ops(reg.load([6, 5], [2, 3], 2)) == []
    graphs[2].replay()
    assert be.forward_metadata.kv_indptr[:3].tolist() == [0, 2, 5]
