"""Test helpers: the padded batch a graph sees, and field comparison against a twin."""

from __future__ import annotations

import torch

from attnmeta.backends.eager.compare import compare_metadata
from attnmeta.runtime import ForwardBatch, ForwardMode


def padded(fb: ForwardBatch, bs: int, mode: ForwardMode = ForwardMode.DECODE) -> ForwardBatch:
    """Live rows, then rows of fill values (seq_len 1, pool row 0)."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    dev = fb.seq_lens.device if fb.seq_lens is not None else torch.device("cpu")
    seq = torch.ones(bs, dtype=torch.int32)
    rpi = torch.zeros(bs, dtype=torch.int64)
    if raw:
        seq[:raw], rpi[:raw] = fb.seq_lens_cpu[:raw], fb.req_pool_indices[:raw].cpu()
    return ForwardBatch(mode, bs, req_pool_indices=rpi.to(dev), seq_lens=seq.to(dev),
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))


def assert_metadata_equal(meta, ref, seq_lens_cpu: torch.Tensor, page_size: int = 1) -> None:
    assert compare_metadata(meta, ref, seq_lens_cpu, page_size) == []
