"""The record of a backend's device checks, and the word that says whose buffers a step's graph reads.

The checks themselves are IR (compiler/ir/ops_guard.py: the ``ingest`` op, fused into the step's first kernel):
every value of a device-resident batch input that the host did not stage is checked where the kernel reads it
(fed from the device, or the engine's own buffer read in place), a bad one replaced by a safe one so no kernel
reads outside its tables, and the first one kept here: four int64 words (set, code, row, value) in host memory
the kernel writes directly (pinned and mapped into the device's address space), so the host reads them without
a launch or a copy. The next step's out_graph looks at one word and raises a ``BatchError`` naming the field,
the row and the value. That is the contract: a bad device value is served safely and reported one step late,
never silent (``ATTNMETA_SYNC_CHECKS=1`` waits for the device and raises within the step, for debugging).

The record is allocated once per backend, zeroed when made, and passed to every plan's graph as an argument that
the bound plan holds (runtime/bound.py), so it lives as long as any graph that writes it.
"""

from __future__ import annotations

import os

import torch

from .errors import BatchError

INTS = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)  # what a batch's integer field may be


class DeviceRecord:
    """Four int64 words the device writes and the host reads in place (pinned on a GPU), and the names of the
    codes the plans' checks write (``binding.guards``)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.tensor = torch.zeros(4, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host_np = self.tensor.numpy()  # read without a torch op
        self.names: dict[int, str] = {}
        self.sync = os.environ.get("ATTNMETA_SYNC_CHECKS") == "1"

    def learn(self, guards) -> None:
        """The codes of a bound plan's checks: (code, what it checks)."""
        self.names.update(guards)

    def raise_pending(self, when: str = "an earlier step") -> None:
        """Raise what the record holds, if anything. An error path: it waits for the device, so the record is
        whole and no step still in flight writes it again after it is cleared."""
        if not self.host_np[0]:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        _, code, row, value = (int(v) for v in self.host_np)
        self.host_np[:] = 0
        name = self.names.get(code, f"check {code}")
        if name == "the staging generation":
            raise BatchError(f"{when} replayed the graph of {row} rows over a batch staged for {value} rows, which is "
                             "not a size that graph serves (its own, or a size with no graph of its own that it pads): "
                             "that step read "
                             "the staging buffer's padding where its rows should be. Call "
                             "init_forward_metadata_out_graph with the batch of the graph you replay (batch_size = the "
                             "captured size)")
        raise BatchError(f"{when} staged {name}[{row}] = {value} from the device, outside its range: the value "
                         "was replaced on the device (no kernel read outside its tables) and that step's metadata "
                         f"is wrong for this row; pass the host mirror of {name} to have bad values refused before "
                         "the step, or fix the engine's batch")

    def check_now(self) -> None:
        """The debugging mode (``ATTNMETA_SYNC_CHECKS=1``): wait for this step's checks and raise in it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.raise_pending("this step")


class EngineWord:
    """The device word every plan's checks read: 1 while a step's graph reads the engine's own buffers, 0 when it
    reads what out_graph staged, with its host mirror: written (one stream-ordered fill) only when it changes."""

    def __init__(self, device: torch.device):
        self.tensor = torch.zeros(1, dtype=torch.int32, device=device)
        self.value = 0

    def set(self, v: int) -> None:
        if self.value != v:
            self.tensor.fill_(v)
            self.value = v
