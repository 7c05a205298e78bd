"""Test helpers: the padded batch a graph sees, and field comparison against a twin."""

from __future__ import annotations

import torch

from attnmeta.backends.eager.compare import compare_metadata, padded

__all__ = ["assert_metadata_equal", "padded"]


def assert_metadata_equal(meta, ref, seq_lens_cpu: torch.Tensor, page_size: int = 1) -> None:
    bad = compare_metadata(meta, ref, seq_lens_cpu, page_size)
    assert bad == [], f"fields differing from the eager twin: {bad}"
