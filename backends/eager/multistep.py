"""Eager twin of the MultiStep wrapper: the inner twin run once per draft step on the batch
with s + 1 drafted tokens, the way a multi-step draft backend loops over its steps."""

from __future__ import annotations

from types import SimpleNamespace

import attrs


class EagerMultiStep:
    """One inner backend per step, as engines do: each keeps its own persistent buffers."""

    def __init__(self, make_inner, num_steps: int):
        self.steps = [make_inner() for _ in range(num_steps)]

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        out = SimpleNamespace()
        for s, inner in enumerate(self.steps):
            step = attrs.evolve(fb, seq_lens=fb.seq_lens + s + 1, seq_lens_cpu=fb.seq_lens_cpu + s + 1)
            for field, v in vars(inner.init_forward_metadata(step)).items():
                setattr(out, f"step{s}_{field}", v)
        return out
