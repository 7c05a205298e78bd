"""The three-method attention-backend contract."""

from __future__ import annotations

import abc


class AttentionBackend(abc.ABC):
    """``init_forward_metadata`` (eager) = out_graph then in_graph.

    - ``init_forward_metadata_out_graph(fb, in_capture)``: host work, planners,
      copies into static buffers; before capture and before every replay.
    - ``init_forward_metadata_in_graph(fb)``: static-shape device ops on
      static buffers only; recorded at capture, re-run by every replay.
    """

    forward_metadata: object | None = None

    def init_forward_metadata(self, fb) -> None:
        self.init_forward_metadata_out_graph(fb, in_capture=False)
        self.init_forward_metadata_in_graph(fb)

    @abc.abstractmethod
    def init_forward_metadata_out_graph(self, fb, in_capture: bool = False) -> None: ...

    @abc.abstractmethod
    def init_forward_metadata_in_graph(self, fb) -> None: ...

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1
