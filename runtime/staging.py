"""Per-step staging of batch inputs into static buffers.

With pack-inputs, every batch input lives in one packed layout: the host
staging buffer (pinned on a GPU) and its device twin. A step writes the live
rows and the padding fill into the host side, then issues ONE host->device
copy. Host-side writes go through NumPy views of the staging buffer: for
the few hundred bytes a step moves, a torch op's dispatch costs more than
the copy. Fields the batch only has on the device take a device->device
copy into their slot after the packed copy (same stream, so ordered).

Hazard: the pinned staging buffer is read by an asynchronous copy. Writing
it again before that copy has run corrupts the previous step's inputs (seen
in engines that plan back to back), so each step waits on the event recorded
after the previous copy before touching the buffer. The event is recorded on
the stream current at the first step (looking the stream up every step costs
more than the copy); an engine that stages on another stream calls
``CompiledAttentionBackend.set_stream``.
"""

from __future__ import annotations

import ctypes

import attrs
import numpy as np
import torch


class BatchError(ValueError):
    """A batch this backend cannot serve as given (too large, too long, missing a field)."""


@attrs.define
class Slot:
    source: str  # ForwardBatch field staged from (host mirror first)
    name: str  # the device field, used when the mirror is absent
    host: torch.Tensor  # [bs] view of the host staging buffer
    dev: torch.Tensor | None  # [bs] view of the device packed buffer, None for host-only inputs
    fill: int
    limit: int | None = None  # largest legal value (sequence lengths: max_context_len less headroom)
    limit_why: str = ""  # where the limit comes from, for the error
    per_row: int = 1  # values per request: 1 for request fields, T for token fields ([bs*T])
    np: np.ndarray = attrs.field(init=False)
    mv: memoryview = attrs.field(init=False)
    ptr: int = attrs.field(init=False)
    itemsize: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.np = self.host.numpy()
        self.mv = memoryview(self.np)
        self.ptr, self.itemsize = self.host.data_ptr(), self.host.element_size()

    def largest(self, live: int) -> int:
        # NumPy's reduction costs ~1.5 µs however short the array; Python's max over the
        # buffer is cheaper up to ~60 values, the batch sizes where a microsecond matters most
        return max(self.mv[:live]) if live <= 48 else int(self.np[:live].max())

    def write(self, src: torch.Tensor, raw: int) -> None:
        """Live rows into the staging buffer. A same-dtype contiguous source is one memmove
        (``Tensor.numpy()`` alone costs more than moving a few hundred bytes)."""
        if src.dtype == self.host.dtype and src.is_contiguous():
            ctypes.memmove(self.ptr, src.data_ptr(), raw * self.itemsize)
        else:
            self.np[:raw] = src.numpy()[:raw]


@attrs.define
class Stager:
    slots: list[Slot]
    copies: list[tuple[torch.Tensor, torch.Tensor]]  # (device, host) pairs: one when packed
    event: list  # shared [event, stream] holder: the previous copy's event (one staging buffer per backend)

    def stage(self, fb, bs: int, raw: int) -> None:
        ev = self.event[0]
        if ev is not None:
            ev.synchronize()  # the previous H2D from this pinned buffer has finished reading it
        late = []
        for s in self.slots:
            src = getattr(fb, s.source, None)
            if src is None and s.source != s.name:
                src = getattr(fb, s.name, None)
            if src is None:
                if raw:
                    raise BatchError(f"the batch has no {s.name} (nor {s.source}), which the spec reads")
                s.np[:] = s.fill
                continue
            live, total = raw * s.per_row, bs * s.per_row
            if src.shape[0] < live:
                raise BatchError(f"{s.source} has {src.shape[0]} values for a batch of {raw} x {s.per_row}")
            if not src.is_cpu:
                if s.dev is None:
                    raise BatchError(f"{s.source} must be a host tensor: the spec reads it on the host")
                late.append((s, src))  # device-only field: D2D after the packed copy, never a D2H sync
            elif live:
                s.write(src, live)
                if s.limit is not None and s.largest(live) > s.limit:
                    raise BatchError(f"a sequence of {s.largest(live)} tokens exceeds {s.limit}, the "
                                     f"longest this backend serves ({s.limit_why}); recompile with a larger "
                                     f"--max-context-len")
            if live < total:
                s.np[live:] = s.fill
        for dev, host in self.copies:
            dev.copy_(host, non_blocking=True)
        if self.copies and self.copies[0][0].device.type == "cuda":
            if ev is None:  # Event.record() with no stream looks the stream up: 5x the cost of recording
                self.event[:] = [torch.cuda.Event(), torch.cuda.current_stream()]
            self.event[0].record(self.event[1])
        for s, src in late:
            s.dev[: raw * s.per_row].copy_(src[: raw * s.per_row], non_blocking=True)
