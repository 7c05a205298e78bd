"""CompileOptions: everything a compile depends on, frozen and validated."""

from __future__ import annotations

import math
import os

import attrs

from .ir.errors import OptionsError
from .modes import ForwardMode

__all__ = ["CompileOptions", "OptionsError", "default_capture_sizes"]


def _sizes(xs) -> tuple[int, ...]:
    return tuple(sorted({int(x) for x in xs}))


def _modes(xs) -> tuple[ForwardMode, ...]:
    return tuple(sorted({x if isinstance(x, ForwardMode) else ForwardMode.parse(x) for x in xs}))


def default_capture_sizes(max_bs: int) -> tuple[int, ...]:
    """Capture sizes like a serving engine's default list: dense small sizes, then steps of 8 and 16."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 513, 16))
    return tuple(s for s in sizes if s <= max_bs) or (max_bs,)


@attrs.frozen
class CompileOptions:
    max_bs: int = 256  # static buffers are sized for this many requests
    capture_sizes: tuple[int, ...] = attrs.field(default=(), converter=_sizes)  # () -> default list
    modes: tuple[ForwardMode, ...] = attrs.field(default=("decode", "idle"), converter=_modes)
    page_size: int = 1
    max_context_len: int = 4096
    num_draft_tokens: int = 4
    topk: int = 1
    num_steps: int = 3
    index_topk: int = 512  # DSV4: compressed entries the indexer selects per query (the model's index_topk)
    # DSV4: the compression ratios the model's KV pool has (SGLang's present_ratios); fields of the others are not built
    compress_ratios: tuple[int, ...] = attrs.field(default=(4, 128), converter=_sizes)
    # FlashInfer specs: the split-KV partition is planned on the GPU every step (FlashInferDecodeAdapter's
    # device planner), so out_graph computes no host indptrs for plan(): no host op per step
    plan_on_device: bool = False
    # the device and model the split-KV heuristic plans for (triton): SMs (0: the engine's static split, every
    # row max_kv_splits), query heads, KV heads, and the most splits a row may get (SGLang's
    # --triton-attention-num-kv-splits)
    sm_count: int = 132  # an H200
    max_kv_splits: int = 8
    num_heads: int = 32
    num_kv_heads: int = 8
    dump_dir: str | None = None
    # which sizes and modes the dumps cover: () = the largest captured size, every mode
    dump_bs: tuple[int, ...] = attrs.field(default=(), converter=_sizes)
    dump_modes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    # verify after every pass: on in tests (tests/conftest.py sets ATTNMETA_VERIFY=1), off when serving
    verify_each: bool = attrs.field(factory=lambda: os.environ.get("ATTNMETA_VERIFY", "0") == "1")
    disabled_passes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    # disabling a safety pass (verify, check-split) compiles specs the CUDA-graph rules would reject
    force: bool = False

    def __attrs_post_init__(self) -> None:
        for name in ("max_bs", "page_size", "max_context_len", "index_topk"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise OptionsError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
        if self.max_bs < 1:
            raise OptionsError(f"max_bs must be >= 1, got {self.max_bs}")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise OptionsError(f"page_size must be a power of two, got {self.page_size}")
        if self.max_context_len < 1:
            raise OptionsError(f"max_context_len must be >= 1, got {self.max_context_len}")
        bad = [s for s in self.capture_sizes if not 1 <= s <= self.max_bs]
        if bad:
            raise OptionsError(f"capture sizes {bad} are outside 1..max_bs={self.max_bs}; "
                               f"raise --max-bs or drop those sizes")
        for name, v in (("num_draft_tokens", self.num_draft_tokens), ("topk", self.topk),
                        ("num_steps", self.num_steps), ("num_heads", self.num_heads),
                        ("num_kv_heads", self.num_kv_heads), ("max_kv_splits", self.max_kv_splits)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise OptionsError(f"{name} must be an int >= 1, got {v!r} (--{name.replace('_', '-')})")
        if not isinstance(self.sm_count, int) or isinstance(self.sm_count, bool) or self.sm_count < 0:
            raise OptionsError(f"sm_count must be an int >= 0 (0: no SM count, every row max_kv_splits), got "
                               f"{self.sm_count!r} (--sm-count)")
        if self.num_heads % self.num_kv_heads:
            raise OptionsError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads} "
                               "(--num-heads, --num-kv-heads)")
        if self.index_topk not in (512, 1024):  # what DeepSeek-V4's sparse kernels are built for
            raise OptionsError(f"index_topk must be 512 or 1024 (the model config's index_topk), "
                               f"got {self.index_topk!r} (--index-topk)")
        if not set(self.compress_ratios) <= {4, 128}:  # DeepSeek-V4.1's c1/c2 are not planned
            raise OptionsError(f"compress_ratios must be drawn from 4 and 128 (DeepSeek-V4's ratios), got "
                               f"{list(self.compress_ratios)} (--compress-ratios)")

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.capture_sizes or default_capture_sizes(self.max_bs)

    def symbols(self) -> dict[str, int]:
        """Config symbols every spec may use (bs is bound per specialization)."""
        L, P = self.max_context_len, self.page_size
        return {"max_bs": self.max_bs, "L": L, "P": P, "W": math.ceil(L / P),
                "D": self.num_draft_tokens, "K": self.topk, "S": self.num_steps}
