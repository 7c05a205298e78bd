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


def backend_json(b) -> dict | None:
    """A backend's options as JSON, their fields only (the spec's ``options_type`` takes them back: the class
    is the spec's to name, not a string the compiler would import), or None."""
    if b is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.asdict(b).items()}


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
    # the device and the model, which several backends' planning follows (triton's split heuristic, FlashInfer's
    # and FlashMLA's schedules, DSV4's indexer): SMs (0: no SM count, triton's engine-static split), query heads
    # and KV heads per attention rank
    sm_count: int = 132  # an H200
    num_heads: int = 32
    num_kv_heads: int = 8
    # sliding-window attention (Mistral, Gemma 3, gpt-oss, Qwen hybrids): the window layers read the last
    # ``sliding_window`` tokens of each request, 0 when the model has none; ``window_pool``: their KV lives in a
    # pool of its own, reached from the full pool's slots through the engine's ``full_to_swa`` table
    sliding_window: int = 0
    window_pool: bool = False
    # the backend's own options: an instance of its folder's frozen options class (``spec.options_type``:
    # DSV4Options, FlashInferOptions, TritonOptions); None is that class's defaults. Read with ``of``.
    backend: object = None
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
        for name in ("max_bs", "page_size", "max_context_len"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise OptionsError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
        if self.max_bs < 1:
            raise OptionsError(f"max_bs must be >= 1, got {self.max_bs} (--max-bs)")
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise OptionsError(f"page_size must be a power of two, got {self.page_size} (--page-size)")
        if self.max_context_len < 1:
            raise OptionsError(f"max_context_len must be >= 1, got {self.max_context_len} (--max-context-len)")
        bad = [s for s in self.capture_sizes if not 1 <= s <= self.max_bs]
        if bad:
            raise OptionsError(f"capture sizes {bad} are outside 1..max_bs={self.max_bs}; raise --max-bs "
                               "or drop those sizes (--capture-sizes)")
        for name, v in (("num_draft_tokens", self.num_draft_tokens), ("topk", self.topk),
                        ("num_steps", self.num_steps), ("num_heads", self.num_heads),
                        ("num_kv_heads", self.num_kv_heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise OptionsError(f"{name} must be an int >= 1, got {v!r} (--{name.replace('_', '-')})")
        if not isinstance(self.sm_count, int) or isinstance(self.sm_count, bool) or self.sm_count < 0:
            raise OptionsError(f"sm_count must be an int >= 0 (0: no SM count, triton's static split), got "
                               f"{self.sm_count!r} (--sm-count)")
        if not isinstance(self.sliding_window, int) or isinstance(self.sliding_window, bool) or self.sliding_window < 0:
            raise OptionsError(f"sliding_window must be an int >= 0 (tokens; 0: no window), got "
                               f"{self.sliding_window!r} (--sliding-window)")
        if not isinstance(self.window_pool, bool):
            raise OptionsError(f"window_pool must be a bool, got {self.window_pool!r} (--window-pool)")
        if self.window_pool and not self.sliding_window:
            raise OptionsError("window_pool=True needs a window: a pool of window layers' KV without "
                               "sliding_window > 0 (--sliding-window) has no layers to serve")
        if self.num_heads % self.num_kv_heads:
            raise OptionsError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads} "
                               "(--num-heads, --num-kv-heads)")
        if self.backend is not None and not attrs.has(type(self.backend)):
            raise OptionsError(f"backend must be a backend's options (an attrs class such as TritonOptions) or None, "
                               f"got {self.backend!r}")

    def of(self, cls: type):
        """The backend's own options, of its class ``cls`` (a spec reads ``options.of(TritonOptions)``): what
        was passed as ``backend``, or ``cls``'s defaults when nothing was."""
        if self.backend is None:
            return cls()
        if not isinstance(self.backend, cls):
            raise OptionsError(f"CompileOptions.backend is a {type(self.backend).__name__}, but this backend takes "
                               f"{cls.__name__}; pass backend={cls.__name__}(...) or leave it None")
        return self.backend

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.capture_sizes or default_capture_sizes(self.max_bs)

    def symbols(self) -> dict[str, int]:
        """Config symbols every spec may use (bs is bound per specialization)."""
        L, P = self.max_context_len, self.page_size
        return {"max_bs": self.max_bs, "L": L, "P": P, "W": math.ceil(L / P),
                "D": self.num_draft_tokens, "K": self.topk, "S": self.num_steps} | \
            ({"SW": self.sliding_window} if self.sliding_window else {})  # only where a window is (dumps stay short)
