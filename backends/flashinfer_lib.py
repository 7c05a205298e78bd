"""FlashInfer itself, for the FlashInfer kinds' planners (FlashInfer's and FlashInfer MLA's): importing it
with a clear error, its version, its float workspace size, and the batches a device planner is checked on
before it is trusted."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from attnmeta.compiler.ir.errors import UserError

# The graph-mode decode wrapper's buffer keywords (paged_kv_*_buffer) and plan() signature this
# adapter calls are those of FlashInfer 0.6; it was checked against 0.6.4 on an H200.
MIN_VERSION = (0, 6)
# FlashInfer's float workspace: SGLang's default. 128 MiB overflows in draft extend at bs 256 (the
# split-KV partial outputs of 1024 query rows), seen on an H200.
WORKSPACE_BYTES = 384 << 20


@attrs.define(eq=False)
class WrapperState:
    """What a FlashInfer adapter keeps per planner site (``Site.state``): the graph-mode wrapper made on the
    site's fields, and how its later steps are planned."""

    wrapper: object
    empty: torch.Tensor  # the indices buffer's empty view: plan() copies nothing into the bound buffer
    pack: Callable | None = None  # packs the drafter's verify mask after the graph (prefill wrappers)
    lean: Callable | None = None  # FlashInfer's C++ planner alone, every step after the first plan()
    device: object | None = None  # the partition planned on the GPU after the graph, where it repeats FlashInfer's


class FlashInferVersionError(UserError):
    """FlashInfer is missing, or older than the API this adapter calls."""


def _flashinfer():
    try:
        import flashinfer
    except ImportError as e:
        raise FlashInferVersionError(f"FlashInfer is not installed ({e}); pip install 'attnmeta[flashinfer]', or "
                                     "serve a backend without a host planner (triton, flashattention)") from None
    raw = getattr(flashinfer, "__version__", "0")
    if _version(flashinfer) < MIN_VERSION:
        raise FlashInferVersionError(f"FlashInfer {raw} is older than {'.'.join(map(str, MIN_VERSION))}, whose "
                                     "graph-mode decode wrapper this adapter binds (paged_kv_*_buffer keywords); "
                                     "pip install -U 'flashinfer-python>=0.6'")
    return flashinfer


def _version(fi) -> tuple[int, ...]:
    return tuple(int(p) for p in getattr(fi, "__version__", "0").split("+")[0].split(".")[:2] if p.isdigit())


def sample_lengths(bs: int, longest: int, short: int = 1) -> list[torch.Tensor]:
    """The batches a device planner is checked on before it is trusted (with the batch at hand): every row
    short, a ramp from short to the longest, one long row among short ones."""
    return [torch.full((bs,), short, dtype=torch.int32), torch.linspace(short, longest, bs).round().int(),
            torch.tensor([longest] + [short] * (bs - 1), dtype=torch.int32)]
