"""DraftRunner: the EAGLE drafter under CUDA graphs."""

from __future__ import annotations

import torch

from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.compiler.modes import ForwardMode
from attnmeta.runtime.forward import ForwardBatch

from ..models import DraftModel
from .graph import GraphRunner


class DraftRunner(GraphRunner):
    """S draft steps of ``topk`` K branches each, recorded in one graph per captured size over a
    MultiStep backend: the model runs attention once per step, on that step's ``step<s>_``
    metadata, over rows ``b*K + k``. Queries are ``[bs, H, Dh]`` (K = 1) or ``[bs, K, H, Dh]``."""

    def __init__(self, backend, model: DraftModel, capture_sizes, device, debug: bool = False):
        if not isinstance(model, DraftModel):
            raise OptionsError(f"DraftRunner runs a DraftModel (attention once per draft step), got "
                               f"{type(model).__name__}")
        opts = getattr(getattr(backend, "compiled", None), "options", None)
        if opts is not None and (opts.num_steps, opts.topk) != (model.num_steps, model.topk):
            raise OptionsError(f"the backend was compiled for num_steps={opts.num_steps}, topk={opts.topk}; the "
                               f"model runs num_steps={model.num_steps}, topk={model.topk}: make them agree")
        super().__init__(backend, model, capture_sizes, device, modes=(ForwardMode.DECODE,), debug=debug)

    def run(self, fb: ForwardBatch, q: torch.Tensor, out: torch.Tensor | None = None,
            copy: bool = True) -> torch.Tensor:
        K, want = self.model.topk, self.model.q.dim()
        if q.dim() != want or (K > 1 and q.shape[1] != K):
            shape = "[bs, K, H, Dh]" if K > 1 else "[bs, H, Dh]"
            raise OptionsError(f"drafter queries are {shape} with K={K}, got {tuple(q.shape)}")
        return super().run(fb, q, out, copy)
