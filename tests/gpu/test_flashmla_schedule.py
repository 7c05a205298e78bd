"""The ``flashmla`` spec's in-graph tile scheduler against FlashMLA's own ``get_mla_metadata`` on a
GPU (the words its decode kernel reads: each part's seven, and ``num_splits``), for DeepSeek's
decode and verify shapes, lengths from 0 to 8192. Needs FlashMLA (SGLang's ``sgl-flash-mla`` wheel: ``flash_mla``)."""

import functools
import random

import pytest
import torch

from attnmeta.backends.flashmla.planner import META_WORDS, SCHEDULED, num_sm_parts, tile_schedule

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _same_as_flashmla(flash_mla, lens: list[int], q_tokens: int) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    want_meta, want_splits = flash_mla.get_mla_decoding_metadata(seq, q_tokens * 128, 1, None, False, None,
                                                                 use_legacy=True)
    parts = num_sm_parts(sms, q_tokens * 128)
    assert want_meta.shape[0] == parts
    meta = torch.zeros(parts, META_WORDS, dtype=torch.int32, device="cuda")
    splits = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
    tile_schedule(seq, meta, splits)
    torch.cuda.synchronize()
    assert torch.equal(meta[:, :SCHEDULED], want_meta[:, :SCHEDULED]), (lens, meta.tolist(), want_meta.tolist())
    assert torch.equal(splits, want_splits), lens


@pytest.mark.parametrize("q_tokens", [1, 4], ids=["decode", "verify4"])
def test_the_in_graph_schedule_is_flashmlas_word_for_word(q_tokens):
    flash_mla = pytest.importorskip("flash_mla", reason="FlashMLA (sgl-flash-mla) is not installed here")
    rng = random.Random(q_tokens)
    for bs in (1, 7, 64, 256):
        for _ in range(4):
            _same_as_flashmla(flash_mla, [rng.choice([1, 63, 64, 65, 4096]) if rng.random() < 0.3
                                          else rng.randint(1, 8192) for _ in range(bs)], q_tokens)


def _gpu_us(fn, n: int = 20) -> float:
    """GPU µs per call of ``fn``: ``n`` calls captured in one CUDA graph, its replay timed (no host gaps)."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g.replay()
    start.record()
    g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n * 1e3


@pytest.mark.parametrize("q_tokens", [1, 4], ids=["decode", "verify4"])
def test_gpu_time_of_the_in_graph_schedule_beside_flashmlas(q_tokens):
    """Not a check: the scheduler's GPU time per launch next to FlashMLA's own, printed for the docs."""
    flash_mla = pytest.importorskip("flash_mla", reason="FlashMLA (sgl-flash-mla) is not installed here")
    sms, rng, row = torch.cuda.get_device_properties(0).multi_processor_count, random.Random(9), []
    for bs in (1, 7, 64, 256):
        seq = torch.tensor([rng.randint(1, 8192) for _ in range(bs)], dtype=torch.int32, device="cuda")
        meta = torch.zeros(num_sm_parts(sms, q_tokens * 128), META_WORDS, dtype=torch.int32, device="cuda")
        splits = torch.zeros(bs + 1, dtype=torch.int32, device="cuda")
        ours = _gpu_us(functools.partial(tile_schedule, seq, meta, splits))
        theirs = _gpu_us(functools.partial(flash_mla.get_mla_decoding_metadata, seq, q_tokens * 128, 1, None, False,
                                           None, use_legacy=True))
        row.append(f"bs {bs}: {ours:.1f} / {theirs:.1f}")
    print(f"\nFlashMLA schedule, {'verify' if q_tokens > 1 else 'decode'}, GPU us per launch attnmeta / FlashMLA: "
          + ", ".join(row))


def test_empty_keys_are_scheduled_as_flashmla_does():
    """A request of no keys (never in SGLang's batches, whose padding rows hold one key)."""
    flash_mla = pytest.importorskip("flash_mla", reason="FlashMLA (sgl-flash-mla) is not installed here")
    for lens in ([0], [5, 0], [0, 300, 0, 70], [0] * 7):
        _same_as_flashmla(flash_mla, lens, 1)
