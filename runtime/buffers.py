"""A backend's static memory: one flat buffer per space of the compiled layout, allocated once.

Every tensor the plans read or write is a view of these (``view``), so no step allocates and
a captured graph's addresses never change. The staging buffer's host side is pinned on a GPU:
its one host->device copy per step is asynchronous (see staging.py for the hazard that brings).
"""

from __future__ import annotations

import torch

from attnmeta.compiler.lowering.binding import Layout, Region, Space

_SPACES = (Space.staging_host, Space.staging_dev, Space.arena, Space.host)


def allocate(sizes: dict[Space, int], device: torch.device) -> dict[Space, torch.Tensor]:
    """Zeroed uint8 buffers for ``sizes``; host spaces on the CPU (the staging one pinned on a GPU)."""
    out = {}
    for space, n in sizes.items():
        dev = torch.device("cpu") if space.on_host else device
        pin = space is Space.staging_host and device.type == "cuda"
        out[space] = torch.zeros(n, dtype=torch.uint8, device=dev, pin_memory=pin)
    return out


def view(spaces: dict[Space, torch.Tensor], r: Region) -> torch.Tensor:
    """The region as a typed, shaped tensor: a view, never a copy."""
    return spaces[r.space][r.offset : r.offset + r.nbytes].view(r.dtype).view(r.shape)


class Buffers:
    """The shared spaces of one backend instance."""

    def __init__(self, layout: Layout, device: torch.device):
        self.spaces = allocate({s: layout.size(s) for s in _SPACES}, device)

    def view(self, r: Region) -> torch.Tensor:
        return view(self.spaces, r)

    def nbytes(self) -> dict[str, int]:
        return {s.value: t.numel() for s, t in self.spaces.items()}
