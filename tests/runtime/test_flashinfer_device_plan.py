"""FlashInfer's graph-mode work partition computed by attnmeta's device planner (one Triton kernel,
here in Triton's interpreter) against FlashInfer's two host planners written out as loops
(``tests/flashinfer_plan_oracle.py``): every word a kernel reads, for random batches and the edges
of the chunk-size search (empty rows, one row, lengths at chunk multiples, one long row among short
ones, batches that fill the grid and so do not split)."""

import attrs
import numpy as np
import pytest
import torch

from attnmeta.backends.flashinfer.device_plan import PlanLayout, plan_on_device
from tests import flashinfer_plan_oracle as fi

WS = 1 << 16


def _words(buf: np.ndarray, at: int, n: int, dtype=np.int32) -> list[int]:
    return np.frombuffer(buf[at : at + n * np.dtype(dtype).itemsize].tobytes(), dtype=dtype).tolist()


def _run(layout: PlanLayout, kv_indptr, qo_indptr=None) -> np.ndarray:
    ws = torch.full((WS,), 0x55, dtype=torch.uint8)
    qo = None if qo_indptr is None else torch.tensor(qo_indptr, dtype=torch.int32)
    plan_on_device(layout, torch.tensor(kv_indptr, dtype=torch.int32), qo, ws)
    return ws.numpy()


def _same(got: np.ndarray, want: np.ndarray, info: list[int], live: int, bs: int, prefill: bool) -> None:
    if prefill:
        padded, rows, rows_at, _, r, q, k, m, o, c, _, _, v, _, _ = info
        assert _words(got, q, live) == _words(want, q, live), "qo tile indices"
        assert _words(got, m, rows + 1) == _words(want, m, rows + 1), "merge indptr"
        assert _words(got, rows_at, 1) == _words(want, rows_at, 1), "total rows"
    else:
        padded, _, _, r, k, o, v, c, _, split = info
        v = v if split else None
    assert _words(got, r, live) == _words(want, r, live), "request indices"
    assert _words(got, k, live) == _words(want, k, live), "kv tile indices"
    assert _words(got, o, bs + 1) == _words(want, o, bs + 1), "o indptr"
    assert _words(got, c, 1) == _words(want, c, 1), "kv chunk size"
    if v is not None:
        assert got[v : v + padded].tolist() == want[v : v + padded].tolist(), "live mask"


def _indptr(lens) -> list[int]:
    return [0, *np.cumsum(lens).tolist()]


def _decode_case(lens, max_grid, kv_heads, page_size):
    pages = [-(-n // page_size) for n in lens]
    info, want, live = fi.decode_plan(_indptr(pages), max_grid, kv_heads, page_size, WS)
    layout = PlanLayout.decode(info, len(lens), page_size)
    assert layout is not None and layout.aligned()
    _same(_run(layout, _indptr(pages)), want, info, live, len(lens), prefill=False)
    return info


def _prefill_case(qlens, lens, num_sm, heads, page_size, head_dim=128):
    pages = [-(-n // page_size) for n in lens]
    info, want, live = fi.prefill_plan(_indptr(qlens), _indptr(pages), num_sm, heads, head_dim, page_size, WS)
    layout = PlanLayout.prefill_plan(info, len(lens), heads, page_size, num_sm)
    assert layout is not None and layout.aligned()
    _same(_run(layout, _indptr(pages), _indptr(qlens)), want, info, live, len(lens), prefill=True)
    return info


@pytest.mark.parametrize("seed", range(12))
def test_cuda_core_decode_partition_equals_flashinfer(seed):
    rng = np.random.default_rng(seed)
    bs = int(rng.choice([1, 2, 7, 33, 130, 257]))
    page = int(rng.choice([1, 16]))
    lens = rng.integers(1, int(rng.choice([40, 3000, 32768])), bs).tolist()
    _decode_case(lens, max_grid=132 * int(rng.choice([4, 8])), kv_heads=int(rng.choice([1, 2, 8])), page_size=page)


@pytest.mark.parametrize("seed", range(12))
def test_prefill_planner_partition_equals_flashinfer(seed):
    """Tensor-core decode (one query row per request) and target verify / draft extend (D rows)."""
    rng = np.random.default_rng(100 + seed)
    bs = int(rng.choice([1, 3, 16, 64, 200]))
    D = int(rng.choice([1, 1, 4, 8]))
    heads = [(8, 2), (32, 8), (32, 4), (16, 16)][int(rng.integers(4))]
    page = int(rng.choice([1, 16]))
    lens = rng.integers(1, int(rng.choice([40, 3000, 32768])), bs).tolist()
    _prefill_case([D] * bs, lens, num_sm=132, heads=heads, page_size=page)


def test_edges_of_the_chunk_search():
    for lens in ([1], [0, 0, 5], [2, 0, 9000], [128] * 4, [127, 128, 129, 256, 257], [32768] + [1] * 15, [5000] * 3):
        for kv_heads in (1, 8):
            _decode_case(lens, max_grid=1056, kv_heads=kv_heads, page_size=1)
            _prefill_case([1] * len(lens), lens, num_sm=132, heads=(4 * kv_heads, kv_heads), page_size=1)
    # 132 CTAs per KV head: 10 + 30 x cdiv(600, c) items fit from c = 150 pages (hand-computed)
    info = _decode_case([1] * 10 + [600] * 30, max_grid=1056, kv_heads=8, page_size=1)
    assert _words(_run(PlanLayout.decode(info, 40, 1), _indptr([1] * 10 + [600] * 30)), info[7], 1) == [150]
    info = _decode_case([300] * 200, max_grid=1056, kv_heads=8, page_size=1)  # 200 x 8 >= 1056 CTAs
    assert info[9] == 0  # no split: one item per request, the longest sequence as the chunk
    info = _decode_case([300] * 100, max_grid=1056, kv_heads=8, page_size=1)
    assert info[9] == 1


def test_a_layout_it_does_not_know_is_refused():
    info, _, _ = fi.prefill_plan(_indptr([1] * 4), _indptr([9] * 4), 132, (8, 2), 128, 1, WS)
    assert PlanLayout.prefill_plan(info, 4, (8, 2), 1, num_sm=100) is None  # another grid bound than the GPU's
    assert PlanLayout.decode(info, 4, 1) is None  # a prefill plan is not a decode one
    dinfo, _, _ = fi.decode_plan(_indptr([9] * 4), 1056, 2, 1, WS)
    assert PlanLayout.decode([*dinfo[:8], 0, dinfo[9]], 4, 1) is None  # not graph mode


def test_the_device_planner_is_trusted_only_where_it_agrees_with_flashinfer():
    """``checked_planner`` replans with FlashInfer's planner (here its transcription) on each sample and
    compares: a planner that would write other words, or a plan info that moves with the lengths,
    is refused (the adapter then keeps the host planner)."""
    from attnmeta.backends.flashinfer.device_plan import checked_planner

    bs, heads = 6, (8, 2)
    ws, state = torch.zeros(WS, dtype=torch.uint8), {}

    def flashinfer_replan(sms):
        def replan(kv_indptr):
            info, buf, _ = fi.prefill_plan(_indptr([1] * bs), kv_indptr.tolist(), sms, heads, 128, 1, WS)
            ws.copy_(torch.from_numpy(buf))
            state["info"] = info
        return replan

    samples = [torch.tensor(_indptr(x), dtype=torch.int32) for x in ([1] * bs, [40000, 1, 1, 1, 1, 1], [9] * bs)]
    qo = torch.tensor(_indptr([1] * bs), dtype=torch.int32)
    flashinfer_replan(132)(samples[-1])
    layout = PlanLayout.prefill_plan(state["info"], bs, heads, 1, 132)
    kv = torch.zeros(bs + 1, dtype=torch.int32)
    ok = checked_planner(layout, kv, qo, ws, flashinfer_replan(132), samples, lambda: state["info"])
    assert ok is not None
    kv.copy_(samples[1])
    ok()  # the hook itself: the long row's partition, from the bound indptr
    _same(ws.numpy(), fi.prefill_plan(qo.tolist(), samples[1].tolist(), 132, heads, 128, 1, WS)[1], state["info"],
          fi.prefill_plan(qo.tolist(), samples[1].tolist(), 132, heads, 128, 1, WS)[2], bs, prefill=True)
    # FlashInfer sizing the grid for another GPU: same plan info, other words for the long row
    wrong = attrs.evolve(layout, limit=layout.limit - 1)
    assert checked_planner(wrong, kv, qo, ws, flashinfer_replan(132), samples, lambda: state["info"]) is None
    moving = iter(range(100))
    assert checked_planner(layout, kv, qo, ws, flashinfer_replan(132), samples,
                           lambda: [*state["info"][:-1], next(moving)]) is None


def test_a_planner_flashinfer_refuses_to_check_is_not_trusted():
    """FlashInfer raising on a sample leaves nothing to compare with: the device planner is refused and
    the wrapper is planned again for the batch at hand (the last sample)."""
    from attnmeta.backends.flashinfer.device_plan import checked_planner

    bs, seen = 2, []
    info, buf, _ = fi.prefill_plan(_indptr([1] * bs), _indptr([5, 6]), 132, (8, 2), 128, 1, WS)
    layout = PlanLayout.prefill_plan(info, bs, (8, 2), 1, 132)

    def replan(kv):
        seen.append(kv.tolist())
        if kv.tolist()[-1] > 100:
            raise RuntimeError("FlashInfer: no")

    samples = [torch.tensor(_indptr([900, 1]), dtype=torch.int32), torch.tensor(_indptr([5, 6]), dtype=torch.int32)]
    got = checked_planner(layout, samples[1], torch.tensor(_indptr([1] * bs), dtype=torch.int32),
                          torch.from_numpy(buf.copy()), replan, samples, lambda: info)
    assert got is None and seen == [_indptr([900, 1]), _indptr([5, 6])]
