"""What a captured graph holds on to, and what the caller holds: outputs the caller owns (or a
view whose use after the next step raises in debug mode), pools that cannot be rebound under a
captured graph, and planners that must return the object the graph captured."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.runtime import ReplayView, StaleBufferError
from attnmeta.sim import DecodeModel, GraphRunner, StaleOutputError
from tests.batches import capture, make_batch, make_pool

L, ROWS, SIZES = 32, 12, (2, 4)


def runner(debug=False):
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=SIZES, max_context_len=L))
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 8, generator=g), torch.randn(ROWS * L + 1, 2, 8, generator=g)
    r = GraphRunner(cb.instantiate(make_pool(ROWS, L)), DecodeModel(k, v, 4, L), SIZES, "cpu", debug=debug)
    r.capture()
    return r


def test_run_returns_an_output_the_caller_owns():
    r = runner()
    q = torch.randn(3, 2, 8, generator=torch.Generator().manual_seed(1))
    first = r.run(make_batch(3, L, ROWS, seed=1), q)
    held = first.clone()
    second = r.run(make_batch(3, L, ROWS, seed=2), q * 2)
    assert torch.equal(first, held)  # the next run did not touch it
    assert not torch.equal(first, second)


def test_run_into_the_callers_buffer():
    r = runner()
    mine = torch.empty(3, 2, 8)
    got = r.run(make_batch(3, L, ROWS, seed=1), torch.randn(3, 2, 8), out=mine)
    assert got is mine and got.data_ptr() == mine.data_ptr()


def test_a_view_is_valid_until_the_next_run_and_debug_mode_says_so():
    r = runner()
    q = torch.randn(3, 2, 8)
    view = r.run(make_batch(3, L, ROWS, seed=1), q, copy=False)
    held = view.clone()
    r.run(make_batch(3, L, ROWS, seed=2), q * 3, copy=False)
    assert not torch.equal(view, held)  # the documented contract: the static buffer moved on
    r = runner(debug=True)
    view = r.run(make_batch(3, L, ROWS, seed=1), q, copy=False)
    (view * 2).sum()  # fine before the next step
    r.run(make_batch(3, L, ROWS, seed=2), q, copy=False)
    with pytest.raises(StaleOutputError, match="an output of step 1 was used after step 2 ran"):
        view.sum()


def test_a_pool_cannot_be_rebound_under_a_captured_graph():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    be = cb.instantiate(make_pool(ROWS, L))
    with pytest.raises(TypeError):
        be.pools["req_to_token"] = make_pool(ROWS, L, seed=3)  # read-only: a captured graph reads the bound one
    be.rebind_pools(req_to_token=make_pool(ROWS, L, seed=4))  # before capture: fine
    g = capture(be, make_batch(4, L, ROWS, seed=0))
    with pytest.raises(StaleBufferError, match=r"pools \['req_to_token'\] cannot be rebound: graphs .* captured"):
        be.rebind_pools(req_to_token=make_pool(ROWS, L, seed=5))
    for step in range(3):  # replays check the pool's storage every time, not only the first
        be.init_forward_metadata_out_graph(ReplayView.of(make_batch(3, L, ROWS, seed=step), 4))
        g.replay()
    be.pools["req_to_token"].set_(make_pool(ROWS, L, seed=6).untyped_storage())  # storage swapped under the graph
    with pytest.raises(StaleBufferError, match="pool req_to_token of .* was rebound after capture"):
        be.init_forward_metadata_out_graph(ReplayView.of(make_batch(3, L, ROWS, seed=7), 4))


def test_a_planner_returning_a_new_object_each_call_is_refused_at_replay():
    made = []

    def fresh_wrapper(site, indptr_host, last_page_len_host):
        made.append(object())  # a new wrapper every call: the graph keeps the capture-time one
        return made[-1]

    cb = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L))
    be = cb.instantiate(make_pool(ROWS, L), planners={"flashinfer.decode_plan": fresh_wrapper})
    capture(be, make_batch(4, L, ROWS, seed=0))
    with pytest.raises(StaleBufferError, match="planner field plan of .* is a new object at replay"):
        be.init_forward_metadata_out_graph(ReplayView.of(make_batch(3, L, ROWS, seed=1), 4))
    be2 = cb.instantiate(make_pool(ROWS, L))  # the stand-in plans one object in place, like FlashInfer
    capture(be2, make_batch(4, L, ROWS, seed=0))
    plan = be2.forward_metadata.plan
    be2.init_forward_metadata_out_graph(ReplayView.of(make_batch(3, L, ROWS, seed=1), 4))
    assert be2.forward_metadata.plan is plan and plan.total_kv == int(
        make_batch(3, L, ROWS, seed=1).seq_lens_cpu.sum()) + 1  # + the padded row's one token
