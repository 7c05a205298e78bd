"""GraphRunner: capture per (mode, bs), pad, replay, fall back to eager.

Capture goes largest size first so every graph shares one memory pool.
At replay a real batch is padded to the smallest captured size that holds
it (the backend stages the rows with the spec's fill values), out_graph
runs, then the graph replays. Past the largest captured size, or in a mode
not captured, the batch runs eagerly.
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter

import torch

from attnmeta.compiler.ir.errors import ContractError, UserError
from attnmeta.compiler.modes import ForwardMode
from attnmeta.runtime.backend import AttentionBackend
from attnmeta.runtime.forward import ForwardBatch, ReplayView
from attnmeta.runtime.graphs import new_graph
from attnmeta.runtime.staging import BatchError, not_a_mode

from ..models import Model

log = logging.getLogger("attnmeta.runtime.sim")


class StaleOutputError(UserError, RuntimeError):
    """A runner's output view was read after the runner's next step overwrote it."""

    rule = "stale-output"


class OutputView(torch.Tensor):
    """A view of a runner's static output buffer (``run(..., copy=False)``), valid until the runner's
    next step, as engines treat graph outputs. With ``debug=True`` every use after that step raises."""

    _runner: GraphRunner
    _step: int

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in (*args, *kwargs.values()):
            if isinstance(a, OutputView) and a._step != a._runner.step:
                raise StaleOutputError(f"an output of step {a._step} was used after step {a._runner.step} ran and "
                                       "overwrote it: copy it first, or let run() return a copy (copy=True)")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def dummy_batch(mode: ForwardMode, bs: int, device, seq_len: int = 1) -> ForwardBatch:
    """Capture-time batch: pool row 0 (reserved, all zero) and short sequences."""
    seq = torch.full((bs,), seq_len, dtype=torch.int32)
    return ForwardBatch(mode, bs, req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=device),
                        seq_lens=seq.to(device), seq_lens_cpu=seq, seq_lens_sum=bs * seq_len)


class GraphRunner:
    def __init__(self, backend: AttentionBackend, model: Model, capture_sizes, device,
                 modes=(ForwardMode.DECODE,), debug: bool = False):
        self.backend, self.model, self.device = backend, model, torch.device(device)
        self.sizes = sorted(set(capture_sizes))
        self.modes = tuple(dict.fromkeys(m.graph_key for m in modes))
        self.graphs: dict[tuple[ForwardMode, int], object] = {}
        self.stats: Counter = Counter()
        self.debug, self.step = debug, 0

    def capture(self) -> None:
        pool = None
        for mode in self.modes:
            for bs in reversed(self.sizes):
                fb = ReplayView(bs, mode, mode, 0)  # every row padding: no batch field is needed to capture
                self.backend.init_forward_metadata_out_graph(fb, in_capture=True)
                self.model.prepare(torch.zeros_like(self.model.q[:bs]), bs)
                self._run_once(fb)  # warm-up: first-call work (Triton compile, allocator) out of capture
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                g = new_graph(self.device, pool)
                with g.capture():
                    self._run_once(fb)
                if self.device.type == "cuda":
                    pool = g.graph.pool()
                self.graphs[(mode, bs)] = g

    def _run_once(self, fb) -> torch.Tensor:
        self.backend.init_forward_metadata_in_graph(fb)
        return self.model.forward(self.backend.forward_metadata, fb.batch_size)

    def padded_size(self, raw: int) -> int | None:
        i = bisect.bisect_left(self.sizes, max(raw, 1))
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, fb: ForwardBatch, q: torch.Tensor, out: torch.Tensor | None = None,
            copy: bool = True) -> torch.Tensor:
        """Metadata + attention for one step; returns the output rows of the real batch. The result is
        the caller's: a copy, or ``out`` written in place (no allocation). ``copy=False`` returns a
        view of the static output buffer instead, valid until the next ``run`` (checked with debug)."""
        self.step += 1
        r = self._step(fb, q)
        if out is not None:
            return out.copy_(r)
        if copy:
            return r.clone()
        if self.debug:
            r = r.as_subclass(OutputView)
            r._runner, r._step = self, self.step
        return r

    def _step(self, fb: ForwardBatch, q: torch.Tensor) -> torch.Tensor:
        if not isinstance(fb.forward_mode, ForwardMode):
            raise not_a_mode(fb)
        key = fb.forward_mode.graph_key
        raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
        if q.shape[0] < raw:
            raise BatchError(f"the query has {q.shape[0]} rows for a batch of {raw} requests: pass one row per request "
                             "(the model reads the first batch_size rows)")
        if key in self.modes and not self.graphs:
            raise ContractError("GraphRunner.run before capture(): call runner.capture() once, before serving")
        bs = self.padded_size(raw)
        if key not in self.modes or bs is None:
            self.stats["eager"] += 1
            log.info("%s batch of %d rows runs eagerly: %s", fb.forward_mode.name.lower(), raw,
                     "its mode was not captured" if key not in self.modes else f"more than the largest captured size "
                     f"{self.sizes[-1]}")
            self.backend.init_forward_metadata(fb)
            self.model.prepare(q[:raw], raw)
            return self.model.forward(self.backend.forward_metadata, raw)[:raw]
        self.stats["replay"] += 1
        self.stats[f"bs{bs}"] += 1
        self.stats["padded_rows"] += bs - raw
        if bs != raw and log.isEnabledFor(logging.DEBUG):
            log.debug("%s batch of %d rows padded to the captured size %d", fb.forward_mode.name.lower(), raw, bs)
        view = ReplayView.of(fb, bs)
        self.backend.init_forward_metadata_out_graph(view)
        self.model.prepare(q[:raw], bs)
        self.graphs[(key, bs)].replay()
        return self.model.out[:raw]
