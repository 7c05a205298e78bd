"""Per-step staging of batch inputs into static buffers, checked at the boundary.

Every batch input lives in one packed layout per mode: the host staging buffer (pinned on a
GPU) and its device twin. A step writes the live rows and the padding fill into the host side,
checks every live value against its range (``BatchError`` naming the field, row, value and
limit), then issues ONE host->device copy. Checks read host values only, never the device:
lengths against the context length, pool rows against the pool, KV slots against the slot
table, dtypes (no floats, so no NaN), and narrowing (an int64 value that an int32 buffer would
wrap). Host-side writes go through NumPy views of the staging buffer: for the few hundred bytes
a step moves, a torch op's dispatch costs more than the copy.

Fields the batch only has on the device (a DSV4 ``out_cache_loc``; ``req_pool_indices`` when the
engine keeps no ``req_pool_indices_cpu``, as SGLang never does; ``seq_lens`` when SGLang's EAGLE
drafter runs without host mirrors) cannot be checked by the host without a sync. out_graph copies
their live values into the input's *feed* (an int64 buffer of the mode, the sentinel past the live
rows; one device->device copy after the packed copy, same stream, so ordered), and the graph's
``ingest`` (compiler/ir/ops_guard.py, fused into its first kernel) checks them there, writing the
first bad value into the device record (runtime/record.py); the next step raises it. A host mirror
is read only on the host: one on the device is refused by name, never checked late.

Every staged step also writes the size it staged for (the *generation*, packed with the inputs) and
clears the engine word: a graph replayed over another size's staging, or over the engine's buffers
after a staged step, is a device fault the graph itself reports.

Hazard: the pinned staging buffer is read by an asynchronous copy. Writing it again before that
copy has run corrupts the previous step's inputs (seen in engines that plan back to back), so
each step waits on the event recorded after the previous copy before touching the buffer. The
event is recorded on the stream current at the first step (looking the stream up every step
costs more than the copy); an engine that stages on another stream calls ``set_stream``.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from attnmeta.compiler.ir.ops_guard import SENTINEL
from attnmeta.compiler.lowering.binding import Kind, Slot

from .errors import BatchError
from .record import INTS as _INTS
from .record import DeviceRecord, EngineWord
from .stagegen import generate

_UNSIGNED = {torch.int32: np.uint32, torch.int64: np.uint64}


def not_a_mode(fb) -> BatchError:
    """The error for a batch whose mode is not attnmeta's (a string, an engine's own enum)."""
    return BatchError(f"forward_mode must be attnmeta's ForwardMode (attnmeta.runtime.ForwardMode), got "
                      f"{getattr(fb, 'forward_mode', None)!r} (actual_forward_mode "
                      f"{getattr(fb, 'actual_forward_mode', None)!r}); map an engine's own mode first "
                      "(attnmeta.integrations.sglang.attnmeta_mode for SGLang's)")


class _Staged:
    """One slot of one plan: its views, bounds and a fast path for the common case (a contiguous
    host tensor of the slot's dtype: one memmove, then one unsigned max catches negatives too)."""

    def __init__(self, slot: Slot, host: torch.Tensor, dev: torch.Tensor | None, env: dict[str, int], dirty: list,
                 full: torch.Tensor | None = None, feed: torch.Tensor | None = None, feed_top: list | None = None):
        self.slot, self.host, self.dev = slot, host, dev
        self.full = (host if full is None else full).numpy()  # the slot's rows at max_bs, shared by its sizes
        self.source, self.device_field = slot.source, slot.device_field
        self.fill, self.per_row = slot.fill, slot.per_row
        self.lo, self.hi = slot.bounds(env)
        self.np = host.numpy()
        self.mv = memoryview(self.np)
        self.unp = self.np.view(_UNSIGNED.get(host.dtype, self.np.dtype))
        self.umv = memoryview(self.unp)
        self.ptr, self.itemsize, self.dtype = host.data_ptr(), host.element_size(), host.dtype
        info = np.iinfo(self.np.dtype)
        self.full_range = self.lo <= info.min and self.hi >= info.max  # nothing to check
        if not self.full_range and not (self.lo in (0, 1) and self.hi >= 0):
            raise ValueError(f"{slot.source}: staged checks cover ranges [0 or 1, hi]; got [{self.lo}, {self.hi}]")
        self.dirty = dirty  # [n]: entries at n and beyond, to max_bs, hold the fill (shared by the mode's sizes)
        self.live, self.u_live, self.s_live = -1, None, None
        # the input's feed at max_bs (the mode's, shared by its sizes) and how many of its rows may hold values
        self.feed, self.feed_top = feed, feed_top if feed_top is not None else [0]

    def write(self, src: torch.Tensor, live: int, capture: bool, name: str) -> None:
        if src.dtype is self.dtype and src.is_contiguous():
            ctypes.memmove(self.ptr, src.data_ptr(), live * self.itemsize)
            if not self.full_range:
                self._check_staged(live, capture, name)
            return
        if src.dtype not in _INTS:
            why = "a float is truncated, and NaN has no value" if src.is_floating_point() else "convert it"
            raise BatchError(f"{name} must hold integers (torch.int32 or torch.int64), got {src.dtype}: {why}")
        a = src.numpy().reshape(-1)[:live]  # another integer dtype: check in its own range, then narrow
        if src.dtype is torch.int64 and not self.full_range:  # an engine's int64 lengths (SGLang's, every
            if self._suspect(a.view(np.uint64), a, live, capture):  # step), checked before narrowing
                self._check(a, capture, name)  # raises, naming the row
            np.copyto(self.np[:live], a, casting="unsafe")
            return
        self._check(a, capture, name)
        self.np[:live] = a

    def _check_staged(self, live: int, capture: bool, name: str) -> None:
        """The live rows just staged, against (lo, hi). Read as unsigned, a negative value is huge, so
        one maximum checks both ends of [0, hi]; a pool row also must not be 0 (reserved). Small
        batches go through Python's max over the buffer; larger ones through ``argmax`` and
        ``count_nonzero``, which skip NumPy's reduction machinery (~0.3 us against ~1 us)."""
        if live <= 16:
            bad = max(self.umv[:live]) > self.hi or (self.lo == 1 and not capture and 0 in self.mv[:live])
        else:
            if live != self.live:  # batch sizes repeat: keep the views of the last size's live rows
                self.live, self.u_live, self.s_live = live, self.unp[:live], self.np[:live]
            bad = self._suspect(self.u_live, self.s_live, live, capture)
        if bad:
            self._check(self.np[:live], capture, name)

    def _suspect(self, u: np.ndarray, signed: np.ndarray, live: int, capture: bool) -> bool:
        """Whether ``live`` values (``u`` read as unsigned, ``signed`` as they are) may leave [lo, hi]: one
        unsigned maximum checks both ends of [0, hi]; a pool row also must not be 0 (reserved)."""
        return bool(u[u.argmax()] > self.hi or (self.lo == 1 and not capture and np.count_nonzero(signed) != live))

    def _check(self, a: np.ndarray, capture: bool, name: str) -> None:
        lo = 0 if capture and self.slot.kind is Kind.row else self.lo
        bad = np.nonzero((a < lo) | (a > self.hi))[0]
        if bad.size:
            raise BatchError(self._message(name, int(bad[0]), int(a[bad[0]]), lo))

    def _message(self, name: str, row: int, v: int, lo: int) -> str:
        s, field = self.slot, f"{name}[{row}] = {v}"
        if s.kind is Kind.length and v > self.hi:
            return (f"{field}: a sequence of {v} tokens exceeds {self.hi}, the longest this backend serves "
                    f"({s.why}); {s.fix}")
        if s.kind is Kind.length:
            return f"{field}: a length cannot be negative (allowed {lo}..{self.hi}, {s.why})"
        if s.kind is Kind.row:
            return (f"{field} is not a request row of this pool: allowed {lo}..{self.hi}, {s.why}; "
                    "pass the engine's req_to_token pool row of each request")
        if s.kind is Kind.slot:
            return f"{field} is not a KV slot of this pool: allowed {lo}..{self.hi} ({s.why})"
        return f"{field} is outside {lo}..{self.hi}, {s.why}: it would wrap when narrowed to {self.dtype}"

    def pad(self, live: int, total: int) -> None:
        """Every row past the live ones gets the fill, up to max_bs, not only to this size (``total``): the
        packed copy moves them all, so a graph of another size replayed after this step (an engine that
        dispatched before it padded) reads padding, never an earlier step's rows. Rows already holding
        the fill are not written again."""
        if self.dirty[0] > live:
            self.full[live:self.dirty[0]] = self.fill
        self.dirty[0] = live

    def fed(self, src: torch.Tensor | None, live: int) -> None:
        """This step's device values into the feed (``src``: ``live`` values, any integer dtype), every row a
        larger step left back to the sentinel; ``src`` None: staged from the host, the feed all sentinel."""
        if self.feed is None:  # no check reads it: straight into the graph's buffer
            if src is not None and live:
                self.dev[:live].copy_(src, non_blocking=True)
            return
        top = self.feed_top[0]
        if src is not None and live:
            self.feed[:live].copy_(src, non_blocking=True)
        else:
            live = 0
        if top > live:
            self.feed[live:top].fill_(SENTINEL)
        self.feed_top[0] = live

    def check_fed(self, src: torch.Tensor, name: str) -> None:
        """The debugging mode (``ATTNMETA_SYNC_CHECKS=1``): device values checked now, in this step (a sync)."""
        v = src.to(torch.int64)
        bad = ((v < self.lo) | (v > self.hi)).nonzero()
        if bad.numel():
            r = int(bad[0, 0])
            raise BatchError(f"this step staged {name}[{r}] = {int(v[r])} from the device, outside {self.lo}.."
                             f"{self.hi} ({self.slot.why}); pass the host mirror to have it refused before the step, "
                             "or fix the engine's batch")


class Stager:
    """The staging of one plan: its slots, and the packed copy of its mode's staging bytes.
    ``fast`` is the plan's generated straight-line staging (runtime/stagegen.py), which takes the
    common case and hands every other step to ``stage``, the general path."""

    def __init__(self, slots: list[_Staged], copies: list[tuple[torch.Tensor, torch.Tensor]], event: list,
                 device: torch.device, record: DeviceRecord, word: EngineWord, generation: np.ndarray | None,
                 bs: int):
        self.slots, self.copies, self.event, self.device = slots, copies, event, device
        self.record, self.word = record, word
        # where each step writes (its size, the size of the graph that pads it): the graph's check reads it
        # (ops_guard.py)
        self.generation, self.sizes = generation, bs
        by_source = {s.source: k for k, s in enumerate(slots)}
        # per-row bounds between two slots: (slot, other slot, bound of slot - other, the spec's bound said)
        self.relations = [(k, by_source[s.slot.relation[0]], *s.slot.relation[1:]) for k, s in enumerate(slots)
                          if s.slot.relation is not None]
        self.fast = generate(self)

    def stage(self, fb, bs: int, raw: int, capture: bool = False) -> None:
        try:
            self._stage(fb, bs, raw, capture)
        except BatchError:
            # a refused step may have written some live rows before the bad one: every row past the next
            # step's live ones is padded again, so no graph reads this batch's rows as padding
            for s in self.slots:
                s.dirty[0] = len(s.full)
            raise

    def _stage(self, fb, bs: int, raw: int, capture: bool) -> None:
        ev = self.event[0]
        if ev is not None:
            ev.synchronize()  # the previous H2D from this pinned buffer has finished reading it
        self.record.raise_pending()  # what the device checks of an earlier step found
        late, hosted = [], {}
        for k, s in enumerate(self.slots):
            name, src = self._source(fb, s, raw)
            live, total = raw * s.per_row, bs * s.per_row
            if src is None:
                s.pad(0, total)
                s.fed(None, 0)
                continue
            if not isinstance(src, torch.Tensor):  # an engine's host list (extend_seq_lens_cpu): the slow path
                try:
                    src = torch.as_tensor(src)
                except (TypeError, ValueError, RuntimeError) as e:
                    raise BatchError(f"{name} must be a tensor or a list of integers, got {type(src).__name__} ({e})") \
                        from None
            if src.dim() > 1 and src.numel() != src.shape[0]:
                raise BatchError(f"{name} must be one value per row (1-D), got shape {tuple(src.shape)}")
            if src.shape[0] < live if src.dim() else True:
                raise BatchError(f"{name} has {src.shape[0] if src.dim() else 'no'} values for a batch of {raw}"
                                 f"{f' x {s.per_row}' if s.per_row > 1 else ''} rows")
            if src.is_cpu:
                if live:
                    s.write(src, live, capture, name)
                    hosted[k] = name
                s.fed(None, 0)
            elif s.dev is None:
                raise BatchError(f"{name} must be a host tensor: the spec reads it on the host")
            elif name == s.source and s.device_field is not None:
                raise BatchError(f"{name} is on {src.device}: it is the host mirror of {s.device_field}, which the "
                                 "host "
                                 "checks before anything runs; pass a CPU tensor (or None, and hand "
                                 f"{s.device_field} alone: its values are then checked on the device, one step late)")
            elif src.device != self.device:
                raise BatchError(f"{name} is on {src.device}, this backend on {self.device}")
            elif src.dtype not in _INTS:
                raise BatchError(f"{name} must hold integers (torch.int32 or torch.int64), got {src.dtype}")
            else:
                late.append((s, src.reshape(-1)[:live], live, name))
            s.pad(0 if capture and not src.is_cpu else live, total)
        for k, j, bound, said in self.relations:
            if k in hosted and j in hosted:
                self._check_relation(k, j, bound, said, raw, hosted)
        if self.generation is not None:
            self.generation[:] = self.sizes
        for dev, host in self.copies:
            dev.copy_(host, non_blocking=True)
        self.feed(late, capture)
        if self.copies and self.device.type == "cuda":
            if ev is None:  # Event.record() with no stream looks the stream up: 5x the cost of recording
                self.event[:] = [torch.cuda.Event(), torch.cuda.current_stream()]
            self.event[0].record(self.event[1])

    def _check_relation(self, k: int, j: int, bound: int, said: str, raw: int, names: dict) -> None:
        """A per-row bound between two staged slots (a draft extend's keys, seq - extend + D, fit L): checked on
        the host values just staged; from the device only each value's own range is (no sync)."""
        a, b = self.slots[k], self.slots[j]
        n = raw * a.per_row
        d = a.np[:n].astype(np.int64) - b.np[:n]
        bad = np.nonzero(d > bound)[0]
        if bad.size:
            r = int(bad[0])
            raise BatchError(f"{names[k]}[{r}] = {int(a.np[r])} with {names[j]}[{r}] = {int(b.np[r])}: the row is "
                             f"past its bound {said} (the keys it reads would not fit the context); "
                             f"{a.slot.fix}")

    def feed(self, late: list, capture: bool) -> None:
        """Device-only fields after the packed copy: into their feeds, which the graph's check reads (a capture's
        rows, the engine's dummy ones, are not fed: the graph reads the staged fill there). Clears the engine
        word: this step's graph reads what was staged."""
        for s, src, live, name in late:
            if self.record.sync and not capture:
                s.check_fed(src, name)
            s.fed(None if capture else src, live)
        self.word.set(0)

    @staticmethod
    def _source(fb, s: _Staged, raw: int):
        """(field name, values) staged for ``s``: its source, or a device field that is a host tensor."""
        src = getattr(fb, s.source, None)
        if src is not None:
            return s.source, src
        if s.device_field is not None:
            d = getattr(fb, s.device_field, None)
            if isinstance(d, torch.Tensor):  # a host tensor after all (a CPU loop), or checked on the device
                return s.device_field, d
        if raw:
            raise BatchError(f"the batch has no {s.device_field or s.source}"
                             f"{f' (nor {s.source})' if s.device_field else ''}, which the spec reads")
        return s.source, None
