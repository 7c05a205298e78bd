"""DSV4 compressor plans against SGLang's planner (tests/dsv4_plan_oracle.py, its CUDA source
written as Python loops): one backend compiled with every mode it serves, captured, replayed on
random batches whose lengths include 1, multiples of 4/64/128/256 and one either side, and the
longest the mode allows; every plan word compared, padded entries included."""

import random

import pytest
import torch

from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView
from tests import dsv4_plan_oracle as sgl
from tests.batches import capture, dsv4_batch, make_pool
from tests.oracles import padded

L, ROWS, MAX_BS, D, SWA_PAGE, SM = 1100, 10, 8, 3, 256, 7  # few SMs: several share a row
DEC, VER, EXT = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND


def test_the_oracle_on_hand_computed_plans():
    """The oracle itself, on cases worked by hand from the planner's formulas."""
    r2t = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16)  # row r, position p -> slot 16r + p
    f2s = torch.arange(64, dtype=torch.int64) + 256  # slot s -> SWA slot 256 + s (page 1)
    # c128, request ring of 128: row 3, seq 1 -> write 3*128 + 0; both read pages 384 // 128 = 3
    assert sgl.plan_decode(torch.tensor([3]), torch.tensor([1]), r2t, f2s, 128, 256, 128).tolist() == [[1, 384, 3, 3]]
    # c4, paged ring of 8: row 1, seq 10 -> position 9 is slot 25, SWA 281 = page 1, offset 25 % 8 = 1
    # -> write 1*8 + 1 = 9, read page 9 // 4 = 2; position 5 (9 - 4): SWA 277 -> 8 + 5 = 13, page 3
    assert sgl.plan_decode(torch.tensor([1]), torch.tensor([10]), r2t, f2s, 4, 256, 8).tolist() == [[10, 9, 3, 2]]
    # c4 verify, spec ring 16 (window 8, pad 10): row 0 at seq 5 with 3 drafts -> positions 5, 6, 7;
    # only position 7 completes a block (token 2, 5 of its 8-token window from the ring); all three write
    c, w = sgl.plan_prefill(torch.tensor([0]), torch.tensor([8]), torch.tensor([3]), r2t, f2s, 4, 256, 16, 3)
    # position 7: SWA 263 -> 16 + 7 = 23, page 5; position 3: SWA 259 -> 16 + 3 = 19, page 4
    assert c.tolist() == [[8, 2 | 5 << 16, 4, 5], [-1, 0, -1, -1], [-1, 0, -1, -1]]
    assert w.tolist() == [[0, 21], [1, 22], [2, 23]]


def test_the_schedule_oracle_on_a_hand_computed_case():
    """Blocks [2, 0, 4] (6 in all) over 4 SMs: 1 each, the last two take 2; starts 0, 1, 2, 4, 6."""
    got = sgl.paged_mqa_schedule(torch.tensor([300, 0, 1000]), 4).tolist()
    assert got == [[0, 0], [0, 1], [2, 0], [2, 2], [3, 0]]


def batch(mode, raw: int, rng: random.Random) -> ForwardBatch:
    return dsv4_batch(mode, raw, rng, L, D, ROWS)


def expected(fb: ForwardBatch, pool, f2s, drafts: int) -> dict:
    """SGLang's plans for this (padded) batch: decode plans in decode, the prefill planner's
    uniform-extend plans in verify (lengths seq + D, D tokens each)."""
    seq, rpi, bs = fb.seq_lens_cpu.long(), fb.req_pool_indices.cpu(), fb.batch_size
    tokens = seq if fb.forward_mode is DEC else (seq[:, None] + 1 + torch.arange(D)).flatten()
    want = {"c4_indexer_schedule": sgl.paged_mqa_schedule(tokens // 4, SM)}
    for r in (4, 128):
        ring = sgl.ring_size(r, drafts)
        if fb.forward_mode is DEC:
            want[f"c{r}_plan_d"] = sgl.plan_decode(rpi, seq, pool, f2s, r, SWA_PAGE, ring)
        else:
            ext = torch.full_like(seq, D)
            c, w = sgl.plan_prefill(rpi, seq + D, ext, pool, f2s, r, SWA_PAGE, ring, bs * D)
            want[f"c{r}_plan_c"], want[f"c{r}_plan_w"] = c, w
    return want


def differing(meta, want: dict) -> list[str]:
    return [k for k, w in want.items() if getattr(meta, k).dtype != torch.int32 or not torch.equal(
        getattr(meta, k).cpu(), w)]


@pytest.mark.parametrize("modes", [("decode", "idle"), ("decode", "idle", "target_verify", "draft_extend")])
def test_plans_equal_sglang_planner(modes):
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(2, 5, 8), max_context_len=L, num_draft_tokens=D,
                          modes=modes, sm_count=SM)
    drafts = D if "target_verify" in modes else 0  # the ring is wider under speculative decoding
    pool = make_pool(ROWS, L, seed=len(modes))
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", opts).instantiate(pool, pools={"full_to_swa": f2s})
    rng = random.Random(len(modes))
    served = [m for m in (DEC, VER, EXT) if m in opts.modes]
    graphs = {(m, bs): capture(be, batch(m, bs, rng)) for m in served for bs in opts.sizes}
    failures = []
    for step in range(24):  # modes interleaved, sizes padded up to the next captured one
        mode = served[step % len(served)]
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in opts.sizes if s >= raw)
        fb = batch(mode, raw, rng)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        graphs[(mode, bs)].replay()
        if mode is EXT:  # draft extend is SWA only: no compressor runs, no plan
            assert not hasattr(be.forward_metadata, "c4_plan_c") and not hasattr(be.forward_metadata, "c4_plan_d")
            continue
        bad = differing(be.forward_metadata, expected(padded(fb, bs, mode), pool, f2s, drafts))
        if bad:
            failures.append((step, mode.name, raw, fb.seq_lens_cpu.tolist(), bad))
    assert not failures, failures


def test_the_comparison_can_fail():
    """A plan built for the wrong ring (speculative vs not) differs, in decode and in verify."""
    opts = CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L, num_draft_tokens=D,
                          modes=("decode", "target_verify"), sm_count=SM)
    pool = make_pool(ROWS, L, seed=5)
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", opts).instantiate(pool, pools={"full_to_swa": f2s})
    for mode in (DEC, VER):
        fb = batch(mode, 4, random.Random(9))
        fb.seq_lens_cpu[:] = fb.seq_lens[:] = torch.tensor([300, 513, 127, 1000])
        be.init_forward_metadata(fb)
        assert differing(be.forward_metadata, expected(padded(fb, 4, mode), pool, f2s, D)) == []
        assert differing(be.forward_metadata, expected(padded(fb, 4, mode), pool, f2s, 0))
        lens = be.forward_metadata.c4_topk_lengths_raw
        assert not torch.equal(be.forward_metadata.c4_indexer_schedule, sgl.paged_mqa_schedule(lens, SM + 1)[:SM + 1])
