"""The checked serving loop on real CUDA graphs: attention through the replayed metadata against
attention computed straight from the pools (DSV4's sparse SWA + compressed attention, the
FlashAttention drafter's page tables), every step's metadata against the eager twin."""

import pytest
import torch

from attnmeta.app.demo import run_demo

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("backend", ["dsv4", "tbo_flashattention", "flashattention_draft"])
def test_replayed_attention_matches_the_pool_oracle(backend):
    r = run_demo(backend, steps=40, max_bs=12, capture_sizes=(1, 4, 8), device="cuda")
    assert r.steps == 40 and r.replays > 0 and r.mismatches == 0, r.failures[:3]
    assert r.max_abs_diff < 1e-4
