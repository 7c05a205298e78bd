"""Host planners that ``host_call`` nodes dispatch to.

A planner is opaque to the compiler: it runs out of graph before every
replay, from host tensors only. The default one stands in for FlashInfer's
``plan()`` where FlashInfer is absent: it checks what plan() would check and
records the partition a decode plan derives (one work item per request).

Like a graph-mode FlashInfer wrapper, a planner returns the same object every
call for a given planner node and batch size, updated in place: a captured graph
holds on to the object it saw at capture, so a new one at replay would never be
read (the runtime refuses it).
"""

from __future__ import annotations

import inspect

import attrs
import torch

from attnmeta.compiler.ir.errors import UserError

# The planner nodes FlashInfer specs declare (``host_call`` names), one name each for the specs, the
# stand-ins below and FlashInferDecodeAdapter. The *_on_device planners (a spec compiled with
# plan_on_device) get only a constant per size; the partition of each step is computed on the GPU.
PLANNER = "flashinfer.decode_plan"
PREFILL_PLANNER = "flashinfer.prefill_plan"
DEVICE_PLANNER = "flashinfer.decode_plan_on_device"
DEVICE_PREFILL_PLANNER = "flashinfer.prefill_plan_on_device"


class PlanError(UserError):
    """A planner given what it cannot plan (device indptrs, mismatched lengths)."""

    rule = "plan"


@attrs.define
class DecodePlan:
    """What a plan derives, updated in place by every call for its (planner node, batch size)."""

    batch_size: int
    total_kv: int = 0
    call: int = 0  # how many plans this planner has made: proves it ran on every replay


class _Planner:
    def __init__(self) -> None:
        self.calls = 0
        self.plans: dict[tuple[str, int], DecodePlan] = {}

    def _record(self, key: str, bs: int, total: int) -> DecodePlan:
        self.calls += 1
        p = self.plans.get((key, bs))
        if p is None:
            p = self.plans[(key, bs)] = DecodePlan(bs)
        p.total_kv, p.call = total, self.calls
        return p


class ReferenceDecodePlanner(_Planner):
    def __call__(self, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor, key: str = "") -> DecodePlan:
        if indptr_host.device.type != "cpu":
            raise PlanError("plan() needs the indptr on the host; a device indptr forces a blocking copy "
                            "every replay. Compute it from seq_lens_cpu in out_graph.")
        bs = last_page_len_host.shape[0]
        if indptr_host.shape[0] != bs + 1:
            raise PlanError(f"indptr has {indptr_host.shape[0]} entries for batch size {bs}; expected {bs + 1}")
        return self._record(key, bs, int(indptr_host.numpy()[-1]))


class ReferencePrefillPlanner(_Planner):
    """Stand-in for the prefill (verify) plan(): host qo and kv indptrs, nothing from the device."""

    def __call__(self, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor, key: str = "") -> DecodePlan:
        for name, t in (("qo_indptr", qo_indptr_host), ("kv_indptr", kv_indptr_host)):
            if t.device.type != "cpu":
                raise PlanError(f"plan() needs {name} on the host; compute it in out_graph from host mirrors")
        if qo_indptr_host.shape != kv_indptr_host.shape:
            raise PlanError(f"qo and kv indptr differ in length: {qo_indptr_host.shape} vs {kv_indptr_host.shape}")
        return self._record(key, kv_indptr_host.shape[0] - 1, int(kv_indptr_host.numpy()[-1]))


class ReferenceDevicePlanner(_Planner):
    """Stand-in for a planner whose partition is computed on the GPU (``plan_on_device``): it gets
    only a constant per size (the last-page lengths, or the query indptr: bs + 1 entries) and has
    nothing to plan on the host."""

    def __init__(self, indptr: bool) -> None:
        super().__init__()
        self.indptr = indptr

    def __call__(self, constant: torch.Tensor, key: str = "") -> DecodePlan:
        if constant.device.type != "cpu":
            raise PlanError("the planner's input is a host constant; got a device tensor")
        return self._record(key, constant.shape[0] - int(self.indptr), 0)


def with_key(planner):
    """A planner as ``host_call`` calls it: ``planner(*host_tensors, key=<planner node name>)``. One
    written without ``key`` (it does not care which node calls it) is wrapped, once, at bind."""
    try:
        params = inspect.signature(planner).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: assume positional only
        params = ()
    if any(p.name == "key" or p.kind is p.VAR_KEYWORD for p in params):
        return planner
    return lambda *args, key="": planner(*args)


def default_planners() -> dict:
    return {PLANNER: ReferenceDecodePlanner(), PREFILL_PLANNER: ReferencePrefillPlanner(),
            DEVICE_PLANNER: ReferenceDevicePlanner(indptr=False),
            DEVICE_PREFILL_PLANNER: ReferenceDevicePlanner(indptr=True)}
