"""Piecewise capture: graphs with eager holes.

- ``BreakableGraph``: a step as named segments; the segments named eager run
  eagerly between recorded pieces (they may sync, allocate, change shape);
  the others are captured once and replayed.
- ``PiecewiseRunner``: EXTEND keyed by token count. The pieces around
  attention are recorded per token bucket; attention runs eagerly between
  them, so the backend's eager ``init_forward_metadata`` sees the *real*
  batch every step (dynamic shapes allowed there).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import torch

from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime.graphs import new_graph
from attnmeta.runtime.staging import BatchError


class BreakableGraph:
    def __init__(self, segments: list[tuple[str, Callable[[], None]]], eager: set[str], device, pool=None):
        unknown = eager - {n for n, _ in segments}
        if unknown:
            raise OptionsError(f"eager regions {sorted(unknown)} name no segment; segments: "
                               f"{[n for n, _ in segments]}")
        self.segments, self.eager, self.device, self.pool = segments, eager, torch.device(device), pool
        self.graphs: dict[str, object] = {}

    def capture(self) -> None:
        for name, fn in self.segments:
            fn()  # warm-up, in order, so every piece sees its inputs as a real step leaves them
            if name in self.eager:
                continue
            g = new_graph(self.device, self.pool)
            with g.capture():
                fn()
            if self.device.type == "cuda":
                self.pool = g.graph.pool()
            self.graphs[name] = g

    def replay(self) -> None:
        for name, fn in self.segments:
            if name in self.eager:
                fn()
            else:
                self.graphs[name].replay()


class PiecewiseRunner:
    """``pre(n)`` and ``post(n)`` work on the first n rows of static buffers; ``attention(fb, n)``
    runs eagerly on the real batch between them."""

    def __init__(self, backend, pre: Callable[[int], None], attention: Callable, post: Callable[[int], None],
                 token_sizes, device):
        self.backend, self.pre, self.attention, self.post = backend, pre, attention, post
        self.sizes, self.device = sorted(set(token_sizes)), torch.device(device)
        self.graphs: dict[int, BreakableGraph] = {}
        self._batch = None
        self.eager_calls = 0

    def _attend(self, n: int) -> None:
        if self._batch is None:
            return  # capture: the eager region has no real batch to run on
        self.backend.init_forward_metadata(self._batch)  # the real, unpadded batch: any shape
        self.attention(self._batch, n)
        self.eager_calls += 1

    def capture(self) -> None:
        pool = None
        for n in reversed(self.sizes):
            bg = BreakableGraph([("pre", lambda n=n: self.pre(n)), ("attention", lambda n=n: self._attend(n)),
                                 ("post", lambda n=n: self.post(n))], {"attention"}, self.device, pool)
            bg.capture()
            pool = bg.pool
            self.graphs[n] = bg

    def bucket(self, num_tokens: int) -> int | None:
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, fb, num_tokens: int) -> int:
        """Replays the bucket holding ``num_tokens``; returns it (None past the largest: run eagerly)."""
        n = self.bucket(num_tokens)
        if n is None:
            raise BatchError(f"{num_tokens} tokens exceed the largest captured bucket {self.sizes[-1]}; "
                             "run the step eagerly or capture a larger bucket")
        self._batch = fb
        try:
            self.graphs[n].replay()
        finally:
            self._batch = None
        return n
