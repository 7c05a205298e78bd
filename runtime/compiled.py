"""A compiled backend behind the three-method contract.

Its static memory is allocated once from the compiled layout (runtime/buffers.py): every mode
has regions of its own, so modes never alias. Each (mode, bs) plan is bound once to views of it
(runtime/bound.py); ``forward_metadata`` is the bound plan's field namespace. A step stages the
batch (checked at the boundary), runs out_graph, and in_graph runs eagerly or is replayed.
"""

from __future__ import annotations

import logging
from types import MappingProxyType

import torch

from attnmeta.compiler.ir.errors import ContractError, NotCompiled
from attnmeta.compiler.lowering.binding import ArgKind

from .backend import AttentionBackend
from .bound import BoundPlan, bind
from .buffers import Buffers
from .checks import StaleBufferError, capture_record, check_pools, check_replay
from .engine import DEFAULT, Sources, bind_engine, make_step
from .errors import BatchError
from .record import DeviceRecord, EngineWord
from .staging import not_a_mode

__all__ = ["BatchError", "CompiledAttentionBackend", "StaleBufferError"]

log = logging.getLogger("attnmeta.runtime")


class CompiledAttentionBackend(AttentionBackend):
    def __init__(self, compiled, req_to_token: torch.Tensor, device=None, planners=None,
                 check_addresses: bool = True, pools: dict | None = None):
        self.compiled = compiled
        self.device = torch.device(device) if device is not None else req_to_token.device
        if self.device.type == "cuda" and self.device.index is None:  # "cuda" is the current device: name it
            self.device = torch.device("cuda", torch.cuda.current_device())
        self._pools = {"req_to_token": req_to_token, **(pools or {})}
        self.env = check_pools(compiled.pools, self._pools)  # R and N, from the pools' shapes
        # the spec's stand-ins (made fresh for this backend), then the caller's
        self.planners = {**{t: make() for t, make in compiled.spec.planners.items()}, **(planners or {})}
        self.check_addresses = check_addresses
        self.max_bs = compiled.options.max_bs
        self.buffers = Buffers(compiled.layout, self.device)
        self._bound: dict[tuple, BoundPlan] = {}
        self._current: BoundPlan | None = None
        self._event: list = [None, None]  # (event after the last staging copy, the stream it was recorded on)
        self._dirty: dict = {}  # staging region -> rows that may hold live values (the rest hold the fill)
        self.record = DeviceRecord(self.device)  # what the graphs' device checks found, reported one step late
        self.word = EngineWord(self.device)  # whether a step's graph reads the engine's buffers (engine.py)
        self._unbacked_logged = False
        for gm, args in compiled.inits.values():  # constants every size shares, written once at max_bs
            gm.forward(*[self.device if a.kind is ArgKind.device else self.buffers.view(a.span) for a in args])

    @property
    def pools(self):
        """The engine tensors bound at instantiate (read-only: a captured graph keeps reading these)."""
        return MappingProxyType(self._pools)

    def rebind_pools(self, **pools: torch.Tensor) -> None:
        """Swap engine pools before anything is captured; after capture the graphs would read the old ones."""
        captured = [b.binding.graph for b in self._bound.values() if b.capture is not None]
        if captured:
            raise StaleBufferError(f"pools {sorted(pools)} cannot be rebound: graphs {captured} captured the old "
                                   "ones; write into the bound pools in place, or instantiate and capture again")
        self.env = check_pools(self.compiled.pools, {**self._pools, **pools})
        self._pools.update(pools)
        self._bound.clear()

    def set_planner(self, target: str, planner) -> None:
        """Serve planner ``target`` (a spec's ``host_call`` name) with ``planner``, called
        ``planner(site, *host_inputs)``; plans bound already move to it, each site with fresh state.
        Before capture only: a captured graph reads what the old planner planned."""
        captured = [b.binding.graph for b in self._bound.values() if b.capture is not None and
                    any(s.target == target for s in b.binding.sites)]
        if captured:
            raise StaleBufferError(f"planner {target!r} cannot change: graphs {captured} captured what the current one "
                                   "planned; set planners before capture (or instantiate and capture again)")
        self.planners[target] = planner
        for b in self._bound.values():
            b.rebind_planner(target, self.planners)

    def bound(self, mode, bs: int) -> BoundPlan:
        key = (mode.graph_key, bs)
        b = self._bound.get(key)
        if b is None:
            try:
                self.compiled.require(mode, bs)
            except NotCompiled as e:
                raise BatchError(str(e)) from None
            plan = self.compiled.plans.get(key)
            if plan is None:  # a size compiled neither for capture nor as max_bs: compile it now, once
                log.info("%s batch of %d rows: no plan compiled ahead, compiling it", key[0].name.lower(), bs)
                plan = self.compiled.specialize(key[0], bs)
            b = self._bound[key] = bind(plan, self, self.buffers, self._pools, self._event, self._dirty)
            log.debug("bound plan %s", b.binding.graph)
        return b

    # --- the contract ---
    def init_forward_metadata_out_graph(self, fb, in_capture: bool = False) -> None:
        bs = fb.batch_size
        try:
            b = self._bound.get((fb.forward_mode.graph_key, bs))
        except AttributeError:
            raise not_a_mode(fb) from None
        if b is not None and b.step is not None and not in_capture and b.step(fb):
            return  # a replay on the engine's own buffers: nothing to stage
        try:
            actual = getattr(fb, "actual_forward_mode", fb.forward_mode)
            raw = 0 if actual.is_idle() else getattr(fb, "raw_batch_size", bs)
        except AttributeError:
            raise not_a_mode(fb) from None
        if b is None:
            if not isinstance(bs, int) or bs < 0:
                raise BatchError(f"batch_size must be a non-negative int, got {bs!r}")
            b = self.bound(fb.forward_mode, bs)
        if b.mode.is_target_verify():
            self._check_drafts(fb)
        if not isinstance(raw, int) or not 0 <= raw <= bs:
            raise BatchError(f"the batch has {raw!r} live rows for a padded size of {bs}: the live rows must be "
                             f"between 0 and {bs} (an engine's num_padding larger than its batch_size?)")
        try:
            b.stager.fast(fb, bs, raw, in_capture)
        except BatchError as e:
            log.info("refused a %s batch: %s", fb.forward_mode.name.lower(), e)
            raise
        b.run_out_graph()
        if not in_capture and b.capture is None and b.host_work:
            self._plan_the_graph_above(b)
        if in_capture:
            b.engine = bind_engine(b, fb, self.device)  # before the record: the graph reads these in place
            b.capture = capture_record(b)
            self.engine_step(b, fb)
            self.word.set(1 if b.engine is not None else 0)
        else:
            if b.capture is not None and self.check_addresses:
                check_replay(b, self._pools)
            if b.engine is not None:
                if b.step is None:  # its planners may have moved to the device since the capture
                    self.engine_step(b, fb)
                if b.step is not None and not self._unbacked_logged:
                    log.info("a %s batch of %d rows is not the engine buffers its graph was captured on: staged "
                             "(correct, with host work per step)", fb.forward_mode.name.lower(), bs)
                    self._unbacked_logged = True
        self._current = b
        self.forward_metadata = b.meta

    def _plan_the_graph_above(self, b: BoundPlan) -> None:
        """A size with no graph of its own, staged by an engine that then replays the graph of the next captured
        size (its padding): that graph's host planners plan from this step's rows (the staging region is the
        mode's, padded past the live rows with the fills), so they never keep an earlier batch's plan."""
        above = [p for (m, bs), p in self._bound.items()
                 if m is b.mode.graph_key and bs > b.bs and p.capture is not None]
        if above:
            up = min(above, key=lambda p: p.bs)
            if up.host_work:
                up.run_out_graph()

    def _check_drafts(self, fb) -> None:
        """A verify batch's draft tokens per request (``spec_info.draft_token_num``, where the batch says) must be
        the compiled count: the metadata strides every request's queries by it."""
        d = getattr(getattr(fb, "spec_info", None), "draft_token_num", None)
        want = self.compiled.options.num_draft_tokens
        if d is not None and d != want:
            raise BatchError(f"a target_verify batch with {d} draft tokens per request (spec_info.draft_token_num), "
                             f"but the backend was compiled for num_draft_tokens={want}, which strides every "
                             f"request's queries; recompile with --num-draft-tokens {d}")

    def engine_step(self, b: BoundPlan, batch, sources: Sources = DEFAULT, requires: tuple = (),
                    publish=None):
        """``b``'s step (set and returned): its replayed out_graph on the engine buffers its capture bound, one
        function of views shaped like ``batch`` (the engine's capture batch; ``sources`` says where its fields sit
        on it, ``requires`` what else a replay needs, ``publish`` what the adapter does after: engine.make_step).
        An adapter that serves the engine's own batches declares its step here, in place of the runtime's; None
        where ``b`` reads no engine buffers or needs host work every step (the ordinary path serves it)."""
        b.step = None if b.engine is None or b.host_work else make_step(self, b, batch, sources, requires, publish)
        return b.step

    def set_stream(self, stream) -> None:
        """Staging records its hazard event on the stream that was current at the first step; an engine
        that moves metadata preparation to another stream says so here."""
        self._event[:] = [torch.cuda.Event(), stream]

    def init_forward_metadata_in_graph(self, fb) -> None:
        b = self._current
        if b is None or b.bs != getattr(fb, "batch_size", None):
            raise ContractError("init_forward_metadata_in_graph before init_forward_metadata_out_graph for this batch")
        b.in_fn(*b.in_args)  # the device checks are its first kernel's (guard-inputs): what a dump shows
        for fn in b.after_in:  # planners' device work (FlashInfer's partition, its mask packing)
            fn()
        if self.record.sync and not _capturing(self.device):
            self.record.check_now()


def _capturing(device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
