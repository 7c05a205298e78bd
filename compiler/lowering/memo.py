"""Bounded memos for generated code (fx modules, launchers, lowering skeletons, loaded kernels).

Sizes and modes of a backend mostly lower to the same few programs, and tests and servers compile
the same specs again: these memos share them. Each holds at most ``size`` entries, dropping the
least recently used, so a long-lived process that compiles many specs does not grow without end
(a dropped entry is regenerated, equal, when asked for again).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable


class Memo:
    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self._d: OrderedDict = OrderedDict()

    def get(self, key: Hashable, make: Callable[[], object]):
        """The entry for ``key``, made by ``make()`` the first time (and after it was dropped)."""
        d = self._d
        if key in d:
            d.move_to_end(key)
            return d[key]
        v = d[key] = make()
        if len(d) > self.size:
            d.popitem(last=False)
        return v

    def clear(self) -> None:
        self._d.clear()

    def __len__(self) -> int:
        return len(self._d)
