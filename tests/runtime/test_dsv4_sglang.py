"""DSV4 metadata against SGLang 0.5.23's own DSV4 metadata kernels (tests/sglang_oracle.py), run
on the CPU: its page-table/positions and causal-SWA builders and its compression-metadata Triton
kernel (in Triton's interpreter). One backend compiled with every mode it serves, captured, then
replayed on random batches whose lengths include 1, multiples of 4/64/128/256 and one either side,
and the longest the mode allows. Each field is compared on what SGLang's kernels read of it, with
SGLang's dtype and width.

The few lines of glue SGLang keeps in its backend class (which does not import on a CPU machine)
are written here from its formulas: the per-token expansion of verify and draft extend
(``seq_lens[:, None] + arange(-T + 1, 1)``, verify on ``seq_lens + D``), padding an index table's
width to a multiple of 64 with -1, the full->SWA slot translation, and the c4 sparse fields."""

import random

import pytest
import torch

from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.backends.dsv4.spec import DSV4Options
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView
from tests import sglang_oracle
from tests.batches import capture, dsv4_batch, make_pool
from tests.oracles import padded

if sglang_oracle.wheel() is None and not sglang_oracle.REQUIRED:
    pytest.skip("SGLang's wheel is not downloaded (make oracles)", allow_module_level=True)

L, ROWS, MAX_BS, D, PAGE, SWA = 1100, 10, 8, 3, 256, 128
DEC, VER, EXT = ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND


@pytest.fixture(scope="module")
def sglang():
    return sglang_oracle.dsv4_kernels()


def pad64(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, -x.shape[-1] % 64), value=-1)


def expected(k, fb: ForwardBatch, pool, f2s, topk: int) -> dict:
    """What SGLang's DSV4 backend computes for this (padded) batch, through its own kernels."""
    meta_kernel, attn_kernels = k
    seq, rpi, mode = fb.seq_lens_cpu, fb.req_pool_indices.cpu(), fb.forward_mode
    if mode is DEC:
        casual, rep = seq.int(), rpi
    else:  # expand_extend_with_same_length over T = D tokens; verify's lengths end at seq + D
        end = seq + D if mode is VER else seq
        casual = (end[:, None] + torch.arange(-D + 1, 1, dtype=torch.int32)).flatten()
        rep = rpi.repeat_interleave(D)
    loc = fb.out_cache_loc.cpu()
    prep = attn_kernels.build_page_table_positions(req_to_token=pool, req_pool_indices_repeated=rep,
                                                   seq_lens_casual=casual, max_seq_len=L, page_size=PAGE,
                                                   swa_window=SWA)
    swa = attn_kernels.build_causal_swa_page_indices(req_to_token=pool, full_to_swa_mapping=f2s,
                                                     req_pool_indices_repeated=rep, seq_lens_casual=casual,
                                                     swa_window=SWA, page_index_aligned_size=64)
    want = {"seq_lens_casual": prep.seq_lens_casual, "positions": prep.positions_casual, "raw_out_loc": loc,
            "page_table": prep.page_table, "swa_topk_lengths": prep.swa_topk_lengths,
            "swa_page_indices": pad64(swa), "swa_out_cache_loc": f2s[loc].to(torch.int32)}
    if mode is EXT:
        return want
    (c4_loc, _, c4_raw, c4_clamp1, c128_loc, _, _, c128_clamp1, c128_pages) = meta_kernel.init_compression_metadata(
        prep.seq_lens_casual, prep.positions_casual, loc, prep.page_table, PAGE, True)
    sparse = torch.full((casual.shape[0], topk), -1, dtype=torch.int32)
    return {**want, "c4_out_loc": c4_loc, "c4_topk_lengths_raw": c4_raw, "c4_topk_lengths_clamp1": c4_clamp1,
            "c128_out_loc": c128_loc, "c128_topk_lengths_clamp1": c128_clamp1, "c128_page_indices": pad64(c128_pages),
            "c4_sparse_topk_lengths": c4_clamp1.clamp(max=topk), "c4_sparse_page_indices": pad64(sparse)}


def differing(meta, want: dict) -> list[str]:
    """Fields that differ on what SGLang's kernels read: the SWA window up to swa_topk_lengths, the
    page table up to each token's pages; every other field whole, dtype and width included."""
    bad = []
    lens = want["seq_lens_casual"]
    for name, w in want.items():
        got = getattr(meta, name)
        if got.dtype != w.dtype or got.shape != w.shape:
            bad.append(f"{name}: {got.dtype}{tuple(got.shape)} vs SGLang {w.dtype}{tuple(w.shape)}")
            continue
        got = got.cpu()
        if name == "swa_page_indices":
            n = want["swa_topk_lengths"].clamp(min=0)
            ok = all(torch.equal(got[i, :c], w[i, :c]) for i, c in enumerate(n.tolist()))
        elif name == "page_table":
            ok = all(torch.equal(got[i, : -(-s // PAGE)], w[i, : -(-s // PAGE)])
                     for i, s in enumerate(lens.clamp(min=0).tolist()))
        else:
            ok = torch.equal(got, w)
        if not ok:
            bad.append(name)
    return bad


def batch(mode, raw: int, rng: random.Random) -> ForwardBatch:
    return dsv4_batch(mode, raw, rng, L, D, ROWS)


@pytest.mark.parametrize("topk", [512, 1024])
def test_every_mode_equals_sglang_kernels(sglang, topk):
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(2, 5, 8), max_context_len=L, num_draft_tokens=D,
                          backend=DSV4Options(index_topk=topk),
                          modes=("decode", "idle", "target_verify", "draft_extend"))
    pool = make_pool(ROWS, L, seed=topk)
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", opts).instantiate(pool, pools={"full_to_swa": f2s})
    rng = random.Random(topk)
    graphs = {(m, bs): capture(be, batch(m, bs, rng)) for m in (DEC, VER, EXT) for bs in opts.sizes}
    failures = []
    for step in range(18):  # modes interleaved, sizes padded up to the next captured one
        mode = (DEC, VER, EXT)[step % 3]
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in opts.sizes if s >= raw)
        fb = batch(mode, raw, rng)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        graphs[(mode, bs)].replay()
        full = padded(fb, bs, mode)
        per = 1 if mode is DEC else D
        full.out_cache_loc = torch.zeros(bs * per, dtype=torch.int64)  # the fill slot 0 on padded rows
        full.out_cache_loc[: raw * per] = fb.out_cache_loc
        bad = differing(be.forward_metadata, expected(sglang, full, pool, f2s, topk))
        if bad:
            failures.append((step, mode.name, raw, fb.seq_lens_cpu.tolist(), bad))
    assert not failures, failures


def test_the_oracle_can_fail(sglang):
    """The comparison is not vacuous: a metadata off by one in one field is caught."""
    opts = CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=L, num_draft_tokens=D)
    pool = make_pool(ROWS, L, seed=1)
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", opts).instantiate(pool, pools={"full_to_swa": f2s})
    fb = batch(DEC, 2, random.Random(3))
    be.init_forward_metadata(fb)
    full = padded(fb, 2, DEC)
    full.out_cache_loc = fb.out_cache_loc
    want = expected(sglang, full, pool, f2s, 512)
    assert differing(be.forward_metadata, want) == []
    want["c128_topk_lengths_clamp1"] = want["c128_topk_lengths_clamp1"] + 1
    want["positions"] = want["positions"].long()
    assert differing(be.forward_metadata, want)[0] == "positions: torch.int32(2,) vs SGLang torch.int64(2,)"
    assert "c128_topk_lengths_clamp1" in differing(be.forward_metadata, want)


@pytest.mark.parametrize("ratios", [(4,), (128,), ()], ids=["c4-only", "c128-only", "swa-only"])
def test_a_pool_with_fewer_ratios_gets_exactly_their_fields(sglang, ratios):
    """compress_ratios: the fields of each ratio the pool has equal SGLang's, and no field, plan or
    schedule of another ratio is built (SGLang builds none), eager and replayed, modes interleaved."""
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(3, 8), max_context_len=L, num_draft_tokens=D,
                          backend=DSV4Options(compress_ratios=ratios),
                          modes=("decode", "target_verify", "draft_extend"))
    pool = make_pool(ROWS, L, seed=len(ratios))
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", opts).instantiate(pool, pools={"full_to_swa": f2s})
    absent = [r for r in (4, 128) if r not in ratios]
    rng = random.Random(3 + len(ratios))
    graphs = {(m, bs): capture(be, batch(m, bs, rng)) for m in (DEC, VER) for bs in opts.sizes}
    for step in range(8):
        mode, raw = (DEC, VER, EXT)[step % 3], rng.randint(1, MAX_BS)
        fb = batch(mode, raw, rng)
        bs = raw if mode is EXT else min(s for s in opts.sizes if s >= raw)
        if mode is EXT:
            be.init_forward_metadata(fb)
        else:
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            graphs[(mode, bs)].replay()
        full = padded(fb, bs, mode)
        per = 1 if mode is DEC else D
        full.out_cache_loc = torch.zeros(bs * per, dtype=torch.int64)
        full.out_cache_loc[: raw * per] = fb.out_cache_loc
        want = expected(sglang, full, pool, f2s, 512)
        want = {k: v for k, v in want.items() if not any(k.startswith(f"c{r}_") for r in absent)}
        assert differing(be.forward_metadata, want) == [], (step, mode.name)
        built = set(vars(be.forward_metadata))
        stray = {k for k in built if any(k.startswith(f"c{r}_") for r in absent)}
        assert not stray, stray
        if mode is not EXT:  # each present ratio's compressor plans, and the indexer schedule with c4
            plans = {f"c{r}_plan_{s}" for r in ratios for s in (("d",) if mode is DEC else ("c", "w"))}
            assert plans <= built and (("c4_indexer_schedule" in built) == (4 in ratios))
