"""FlashInfer and Triton metadata against SGLang 0.5.23's own kernels (tests/sglang_oracle.py), run
in Triton's interpreter: the Triton backend's split heuristic ``get_num_kv_splits_triton`` (both
terms: sequence lengths and SM count) and the kv-indices gather ``create_flashinfer_kv_indices_triton``,
for random padded batches, several devices and head layouts, and the lengths around each power
of two where the SM-count term steps."""

import random

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView
from tests import sglang_oracle
from tests.batches import capture, make_pool
from tests.oracles import padded

if sglang_oracle.wheel() is None and not sglang_oracle.REQUIRED:
    pytest.skip("SGLang's wheel is not downloaded (make oracles)", allow_module_level=True)

L, ROWS, MAX_BS, MAX_SPLITS = 4096, 40, 16, 8
LENGTHS = sorted({1, 2, 3, L} | {64 * 2 ** k + d for k in range(7) for d in (-1, 0, 1) if 64 * 2 ** k + d <= L})


@pytest.fixture(scope="module")
def sglang():
    return sglang_oracle.attention_kernels()


def sglang_splits(k, seq: torch.Tensor, opts: CompileOptions) -> list[int]:
    meta, _ = k
    out = torch.empty_like(seq)
    n = seq.shape[0]
    meta.get_num_kv_splits_triton[(1,)](out, seq, n, 1, opts.num_heads, opts.num_kv_heads, MAX_SPLITS,
                                        opts.sm_count, MAX_NUM_SEQ=max(16, 1 << (n - 1).bit_length()))
    return out.tolist()


def batch(lens: list[int], rng: random.Random) -> ForwardBatch:
    seq = torch.tensor(lens, dtype=torch.int32)
    rows = torch.tensor(rng.sample(range(1, ROWS), len(lens)), dtype=torch.int64)
    return ForwardBatch(ForwardMode.DECODE, len(lens), req_pool_indices=rows, req_pool_indices_cpu=rows.clone(),
                        seq_lens=seq, seq_lens_cpu=seq.clone())


@pytest.mark.parametrize(("sms", "heads", "kv_heads"), [(132, 32, 8), (78, 32, 32), (132, 64, 4), (1, 16, 16)],
                         ids=["h200-gqa4", "mi300-mha", "h200-gqa16", "one-sm"])
def test_num_kv_splits_equals_sglang(sglang, sms, heads, kv_heads):
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(1, 4, 16), max_context_len=L, sm_count=sms,
                          num_heads=heads, num_kv_heads=kv_heads)
    be = compile_backend("triton", opts).instantiate(make_pool(ROWS, L))
    rng = random.Random(sms + heads)
    graphs = {bs: capture(be, batch([1] * bs, rng)) for bs in opts.sizes}
    cases = [[n] for n in LENGTHS] + [[rng.choice(LENGTHS + [rng.randint(1, L)]) for _ in range(rng.randint(1, 16))]
                                      for _ in range(40)]
    bad = []
    for lens in cases:
        fb = batch(lens, rng)
        bs = min(s for s in opts.sizes if s >= len(lens))
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        graphs[bs].replay()
        full = padded(fb, bs)  # SGLang's graph runner pads with its fill length, 1, as attnmeta does
        want = sglang_splits(sglang, full.seq_lens_cpu.clone(), opts)
        got = be.forward_metadata.num_kv_splits.tolist()
        if got != want:
            bad.append((lens, got, want))
    assert not bad, bad[:5]


@pytest.mark.parametrize("mode", ["decode", "target_verify"])
def test_kv_indices_equal_sglang(sglang, mode):
    _, kv = sglang
    D = 4
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(4, 16), max_context_len=1024, modes=(mode,),
                          num_draft_tokens=D)
    pool = make_pool(ROWS, 1024, seed=5)
    be = compile_backend("flashinfer", opts).instantiate(pool)
    rng = random.Random(7)
    M = ForwardMode[mode.upper()]
    for _ in range(10):
        lens = [rng.randint(1, 1024 - D) for _ in range(rng.randint(1, MAX_BS))]
        fb = batch(lens, rng)
        fb.forward_mode = M
        be.init_forward_metadata(fb)
        m = be.forward_metadata
        kv_lens = fb.seq_lens + (D if M is ForwardMode.TARGET_VERIFY else 0)  # verify reads the drafts too
        indptr = torch.nn.functional.pad(torch.cumsum(kv_lens, 0, dtype=torch.int32), (1, 0))
        want = torch.full((int(indptr[-1]),), -7, dtype=torch.int32)
        kv.create_flashinfer_kv_indices_triton[(len(lens),)](pool, fb.req_pool_indices, kv_lens, indptr, None, want,
                                                             pool.stride(0))
        assert torch.equal(m.kv_indptr[: len(lens) + 1], indptr)
        assert torch.equal(m.kv_indices[: int(indptr[-1])], want)
