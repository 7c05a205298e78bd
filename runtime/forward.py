"""ForwardBatch and the replay view, with SGLang's field names."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from attnmeta.compiler.modes import ForwardMode


@attrs.define
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor | None = None  # [bs] int64, device
    req_pool_indices_cpu: torch.Tensor | None = None  # host mirror, when the scheduler has it
    seq_lens: torch.Tensor | None = None  # [bs] int32, device
    seq_lens_cpu: torch.Tensor | None = None  # [bs] int32, host mirror of seq_lens
    seq_lens_sum: int | None = None
    out_cache_loc: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_seq_lens_cpu: torch.Tensor | None = None
    extend_prefix_lens: torch.Tensor | None = None
    extend_prefix_lens_cpu: torch.Tensor | None = None
    encoder_lens: torch.Tensor | None = None
    spec_info: Any = None
    tbo_split_seq_index: int | None = None
    tbo_children: list | None = None

    @property
    def actual_forward_mode(self) -> ForwardMode:
        return self.forward_mode

    @property
    def raw_batch_size(self) -> int:
        return self.batch_size


@attrs.define
class ReplayView:
    """What out_graph sees at replay: ``batch_size`` is the captured size,
    ``forward_mode`` the capture mode, ``actual_forward_mode`` the runtime
    mode (IDLE stays IDLE). Batch fields hold the real, unpadded rows; the
    backend pads them with the spec's fill values while staging them."""

    batch_size: int
    forward_mode: ForwardMode
    actual_forward_mode: ForwardMode
    raw_batch_size: int
    req_pool_indices: torch.Tensor | None = None
    req_pool_indices_cpu: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    seq_lens_cpu: torch.Tensor | None = None
    seq_lens_sum: int | None = None
    out_cache_loc: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    spec_info: Any = None
    extend_seq_lens: torch.Tensor | None = None
    extend_seq_lens_cpu: torch.Tensor | None = None

    @classmethod
    def of(cls, fb: ForwardBatch, bs: int) -> ReplayView:
        raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
        return cls(bs, fb.forward_mode.graph_key, fb.forward_mode, raw, fb.req_pool_indices,
                   fb.req_pool_indices_cpu, fb.seq_lens, fb.seq_lens_cpu, fb.seq_lens_sum, fb.out_cache_loc,
                   fb.positions, fb.spec_info, fb.extend_seq_lens, fb.extend_seq_lens_cpu)
