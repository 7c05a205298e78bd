"""A backend's static memory: one flat buffer per space of the compiled layout, allocated once.

Every tensor the plans read or write is a view of these (``view``), so no step allocates and
a captured graph's addresses never change. The staging buffer's host side is pinned on a GPU:
its one host->device copy per step is asynchronous (see staging.py for the hazard that brings).
"""

from __future__ import annotations

import torch

from attnmeta.compiler.ir.ops_guard import SENTINEL
from attnmeta.compiler.lowering.binding import Layout, Memory, Span

_SPACES = (Memory.staging_host, Memory.staging_dev, Memory.arena, Memory.host)


def allocate(sizes: dict[Memory, int], device: torch.device) -> dict[Memory, torch.Tensor]:
    """Zeroed uint8 buffers for ``sizes``; host spaces on the CPU (the staging one pinned on a GPU)."""
    out = {}
    for space, n in sizes.items():
        dev = torch.device("cpu") if space.on_host else device
        pin = space is Memory.staging_host and device.type == "cuda"
        out[space] = torch.zeros(n, dtype=torch.uint8, device=dev, pin_memory=pin)
    return out


def view(spaces: dict[Memory, torch.Tensor], r: Span) -> torch.Tensor:
    """The region as a typed, shaped tensor: a view, never a copy."""
    return spaces[r.space][r.offset : r.offset + r.nbytes].view(r.dtype).view(r.shape)


class Buffers:
    """The shared spaces of one backend instance."""

    def __init__(self, layout: Layout, device: torch.device):
        self.spaces = allocate({s: layout.size(s) for s in _SPACES}, device)
        arena = self.spaces[Memory.arena]
        for offset, nbytes in layout.feeds:  # a feed holds the sentinel until a step feeds it (ops_guard.py)
            arena[offset : offset + nbytes].view(torch.int64).fill_(SENTINEL)

    def view(self, r: Span) -> torch.Tensor:
        return view(self.spaces, r)

    def nbytes(self) -> dict[str, int]:
        return {s.value: t.numel() for s, t in self.spaces.items()}
