"""SGLang's batches and modes, as a compiled attnmeta backend stages them.

Nothing here imports SGLang: a batch is read by attribute, so SGLang's real ``ForwardBatch`` and
the replay view its CUDA-graph runner builds (``build_replay_fb_view``) are read the same way.

Who pads. SGLang's graph runner copies a replayed batch into its capture-time buffers and fills
the padded rows with ``get_cuda_graph_seq_len_fill_value()`` (and pool row 0); the view it hands
the backend has those ``[:bs]`` buffers, ``num_padding = bs - raw_bs`` and the runtime mode in
``actual_forward_mode``. attnmeta reads only the ``raw_bs`` live rows and pads the rest itself with
the fill values the spec declares (checked by check-split to be safe to read). The two agree,
because ``get_cuda_graph_seq_len_fill_value()`` returns the spec's fill, but the metadata never
depends on the engine's padding: a fill that the spec did not declare cannot reach a kernel.
"""

from __future__ import annotations

from typing import Any

from attnmeta.compiler.ir.errors import ContractError
from attnmeta.compiler.modes import ForwardMode
from attnmeta.runtime import BatchError
from attnmeta.runtime.engine import Path

# SGLang's mode name -> attnmeta's. SGLang's DSV4 and EAGLE serve draft extend in its V2 layout only
# (T query slots per request), which is the layout attnmeta's DRAFT_EXTEND plans.
MODES = {"DECODE": ForwardMode.DECODE, "IDLE": ForwardMode.IDLE, "TARGET_VERIFY": ForwardMode.TARGET_VERIFY,
         "DRAFT_EXTEND_V2": ForwardMode.DRAFT_EXTEND, "EXTEND": ForwardMode.EXTEND, "MIXED": ForwardMode.MIXED}


def attnmeta_mode(mode) -> ForwardMode:
    """attnmeta's mode for an SGLang ``ForwardMode`` (matched by name, so SGLang's enum values may move)."""
    m = MODES.get(getattr(mode, "name", None))
    if m is None:
        raise BatchError(f"SGLang forward mode {getattr(mode, 'name', mode)!r} has no attnmeta counterpart; "
                         f"attnmeta serves {sorted(MODES)}")
    return m


def _first(*xs):
    return next((x for x in xs if x is not None), None)


def _padding(fb: Any, mode: ForwardMode, bs: int, width: int) -> int:
    """Rows SGLang's graph runner padded the batch with. The decode and draft-decode runners say so
    (``num_padding``); the draft-extend runner pads its buffers to ``bs`` rows (request row 0, the fill
    length) and hands over the live requests' tokens only (``input_ids``, ``out_cache_loc``), ``width``
    per request."""
    padding = getattr(fb, "num_padding", None)
    if padding is None and mode is ForwardMode.DRAFT_EXTEND and width:
        tokens = _first(getattr(fb, "input_ids", None), getattr(fb, "out_cache_loc", None))
        padding = max(bs - tokens.shape[0] // width, 0) if tokens is not None else 0
    padding = padding or 0
    if not isinstance(padding, int) or not 0 <= padding <= bs:
        raise BatchError(f"num_padding={padding!r} for a batch of {bs} rows: the live rows (batch_size - "
                         f"num_padding) must be between 0 and {bs}")
    return padding


# Where a field of the view sits on SGLang's own batch where it is not an attribute of the same name (draft extend
# V2 keeps its lengths on spec_info), for the replay check of runtime/engine.py: as the view is filled, the first
# of the paths that holds a value, every step.
ENGINE_PATHS = {"extend_seq_lens": (Path(("extend_seq_lens",)), Path(("spec_info", "extend_seq_lens_tensor")))}


class BatchView:
    """One SGLang batch under attnmeta's field names. One view per backend, refilled every step
    (a step allocates nothing); ``forward_mode`` is the graph's mode, ``actual_forward_mode`` the
    batch's, ``raw_batch_size`` its live rows."""

    __slots__ = ("batch_size", "forward_mode", "actual_forward_mode", "raw_batch_size", "req_pool_indices",
                 "req_pool_indices_cpu", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc", "positions",
                 "extend_seq_lens", "extend_seq_lens_cpu", "extend_prefix_lens", "extend_prefix_lens_cpu",
                 "spec_info", "source", "draft_width")

    def __init__(self, draft_width: int = 0) -> None:
        self.draft_width = draft_width  # query rows per request in draft extend (0: unknown)
        self.source = None

    def fill(self, fb: Any) -> BatchView:
        bs = fb.batch_size
        mode = attnmeta_mode(fb.forward_mode)
        actual = attnmeta_mode(getattr(fb, "actual_forward_mode", None) or fb.forward_mode)
        self.batch_size, self.forward_mode, self.actual_forward_mode = bs, mode, actual
        self.raw_batch_size = 0 if actual.is_idle() else bs - _padding(fb, mode, bs, self.draft_width)
        self.req_pool_indices, self.seq_lens, self.seq_lens_cpu = fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu
        self.req_pool_indices_cpu = getattr(fb, "req_pool_indices_cpu", None)
        self.seq_lens_sum = getattr(fb, "seq_lens_sum", None)
        self.out_cache_loc = getattr(fb, "out_cache_loc", None)
        self.positions = getattr(fb, "positions", None)
        spec = self.spec_info = getattr(fb, "spec_info", None)
        self.extend_prefix_lens = getattr(fb, "extend_prefix_lens", None)
        self.extend_prefix_lens_cpu = getattr(fb, "extend_prefix_lens_cpu", None)
        self.extend_seq_lens = getattr(fb, "extend_seq_lens", None)
        self.extend_seq_lens_cpu = getattr(fb, "extend_seq_lens_cpu", None)
        if mode is ForwardMode.DRAFT_EXTEND and spec is not None:  # V2 keeps the accepted counts on spec_info
            self.extend_seq_lens = _first(self.extend_seq_lens, getattr(spec, "extend_seq_lens_tensor", None))
            self.extend_seq_lens_cpu = _first(self.extend_seq_lens_cpu, getattr(spec, "extend_seq_lens_cpu", None))
        self.source = fb
        return self

    def require(self, fb: Any) -> BatchView:
        """This view, if it was last filled from ``fb``: in_graph must follow out_graph on one batch."""
        if self.source is not fb:
            raise ContractError("init_forward_metadata_in_graph got another batch than the last "
                                "init_forward_metadata_out_graph; call them in pairs on the same batch")
        return self
