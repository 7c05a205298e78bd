"""Forward modes, with SGLang's names and predicates so backends port over."""

from __future__ import annotations

import enum

from .ir.errors import OptionsError


class ForwardMode(enum.IntEnum):
    EXTEND = 1
    DECODE = 2
    MIXED = 3
    IDLE = 4
    TARGET_VERIFY = 5
    DRAFT_EXTEND = 6

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_draft_extend(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND

    def is_extend(self) -> bool:
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY)

    def is_cuda_graph(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE)

    @property
    def graph_key(self) -> ForwardMode:
        """The mode whose plan serves this one: IDLE replays DECODE's graph."""
        return ForwardMode.DECODE if self is ForwardMode.IDLE else self

    @classmethod
    def parse(cls, s: str) -> ForwardMode:
        try:
            return cls[s.upper()]
        except KeyError:
            raise OptionsError(f"unknown forward mode {s!r}; choose from {[m.name.lower() for m in cls]}") from None
