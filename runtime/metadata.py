"""A bound plan's metadata: its fields by name, and a composed spec's groups of fields by index.

A composed spec names its fields with a prefix per part (``multistep``: ``step<s>_``, ``tbo``: ``tbo<c>_``,
DeepSeek-V4's compressed pools: ``c<r>_``). Readers take a part by index instead of building those names:
``meta.step(s).kv_indptr``, ``meta.child(0).plan``, ``meta.ratio(128).compress_metadata``. The prefixes are
written here once, for the specs that compose (``step_prefix`` ...) and the readers alike."""

from __future__ import annotations

from types import SimpleNamespace


def step_prefix(s: int) -> str:
    """The fields of a multi-step drafter's step ``s`` (0-based)."""
    return f"step{s}_"


def child_prefix(c: int) -> str:
    """The fields of two-batch overlap's child ``c`` (0 or 1)."""
    return f"tbo{c}_"


def ratio_prefix(r: int) -> str:
    """The fields of DeepSeek-V4's compressed pool of ratio ``r``."""
    return f"c{r}_"


class Group:
    """One part's fields of a metadata object, read live (a planner's result set every step is seen)."""

    __slots__ = ("_meta", "_prefix")

    def __init__(self, meta, prefix: str):
        object.__setattr__(self, "_meta", meta)
        object.__setattr__(self, "_prefix", prefix)

    def __getattr__(self, name: str):
        try:
            return getattr(self._meta, self._prefix + name)
        except AttributeError:
            raise AttributeError(f"no field {self._prefix}{name} (this part has {self.fields()})") from None

    def fields(self) -> list[str]:
        """The part's field names, without the prefix."""
        n = len(self._prefix)
        return sorted(k[n:] for k in vars(self._meta) if k.startswith(self._prefix))

    def __repr__(self) -> str:
        return f"Group({self._prefix!r}: {', '.join(self.fields())})"


class Metadata(SimpleNamespace):
    """The fields of one bound plan (static buffers, planner results), with its parts by index."""

    def step(self, s: int) -> Group:
        return Group(self, step_prefix(s))

    def child(self, c: int) -> Group:
        return Group(self, child_prefix(c))

    def ratio(self, r: int) -> Group:
        return Group(self, ratio_prefix(r))
