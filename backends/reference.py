"""Stand-in planners, for specs to declare (``BackendSpec.planners``) where the real planner is
absent (FlashInfer on a CPU machine).

A planner is opaque to the compiler: it runs out of graph before every replay, from host tensors
only, called ``planner(site, *host_inputs)`` (runtime/planning.py). The stand-ins check what
FlashInfer's ``plan()`` would check and record the partition a plan derives in their site's
state. Like a graph-mode FlashInfer wrapper, a planner returns the same object every call for a
given site, updated in place: a captured graph holds on to the object it saw at capture, so a
new one at replay would never be read (the runtime refuses it).
"""

from __future__ import annotations

import attrs
import torch

from attnmeta.runtime.planning import PlanError, Site

__all__ = ["DecodePlan", "PlanError", "ReferenceDecodePlanner", "ReferenceDevicePlanner",
           "ReferencePrefillPlanner"]


@attrs.define
class DecodePlan:
    """What a plan derives, updated in place by every call for its site."""

    batch_size: int
    total_kv: int = 0
    call: int = 0  # how many plans this planner has made: proves it ran on every replay


class RecordingPlanner:
    """A stand-in that counts its calls and keeps what it derived in its site's state."""

    def __init__(self) -> None:
        self.calls = 0

    def _record(self, site: Site, bs: int, total: int) -> DecodePlan:
        self.calls += 1
        p = site.state
        if not isinstance(p, DecodePlan):  # its state is the plan it returns, made on the first call
            p = site.state = DecodePlan(bs)
        p.total_kv, p.call = total, self.calls
        return p


def require_host(name: str, t: torch.Tensor) -> None:
    if t.device.type != "cpu":
        raise PlanError(f"plan() needs {name} on the host; a device tensor forces a blocking copy every replay. "
                        "Compute it in out_graph from the host mirrors (seq_lens_cpu)")


class ReferenceDecodePlanner(RecordingPlanner):
    """Stand-in for the decode ``plan()``: the host kv indptr and the last-page lengths."""

    def __call__(self, site: Site, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor) -> DecodePlan:
        require_host("the kv indptr", indptr_host)
        bs = last_page_len_host.shape[0]
        if indptr_host.shape[0] != bs + 1:
            raise PlanError(f"indptr has {indptr_host.shape[0]} entries for batch size {bs}; expected {bs + 1}")
        return self._record(site, bs, int(indptr_host.numpy()[-1]))


class ReferencePrefillPlanner(RecordingPlanner):
    """Stand-in for the prefill (verify) ``plan()``: host qo and kv indptrs, nothing from the device."""

    def __call__(self, site: Site, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor) -> DecodePlan:
        require_host("qo_indptr", qo_indptr_host)
        require_host("kv_indptr", kv_indptr_host)
        if qo_indptr_host.shape != kv_indptr_host.shape:
            raise PlanError(f"qo and kv indptr differ in length: {qo_indptr_host.shape} vs {kv_indptr_host.shape}")
        return self._record(site, kv_indptr_host.shape[0] - 1, int(kv_indptr_host.numpy()[-1]))


class ReferenceDevicePlanner(RecordingPlanner):
    """Stand-in for a planner whose partition is computed on the GPU (``plan_on_device``): it gets
    only a constant per size (the last-page lengths, or the query indptr: bs + 1 entries) and has
    nothing to plan on the host."""

    def __init__(self, indptr: bool) -> None:
        super().__init__()
        self.indptr = indptr

    def __call__(self, site: Site, constant: torch.Tensor) -> DecodePlan:
        require_host("the planner's constant", constant)
        return self._record(site, constant.shape[0] - int(self.indptr), 0)
