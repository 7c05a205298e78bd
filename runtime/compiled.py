"""A compiled backend behind the three-method contract.

Static buffers are allocated once at maximum size: one per batch input
(staged and padded every step), one per in_graph metadata output (written in
place by the captured work), one per out_graph value the graph reads. Every
(mode, bs) plan binds views of those buffers once; ``forward_metadata`` is
the bound plan's field namespace, whose tensors are those views.
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import torch

from attnmeta.compiler import CompiledBackend
from attnmeta.compiler.ir import Role
from attnmeta.compiler.lowering.fx import DEVICE, PLANNERS, LoweredPlan, eval_const, out_arg
from attnmeta.compiler.modes import ForwardMode

from .backend import AttentionBackend
from .planners import default_planners


class BatchError(ValueError):
    """A batch this backend cannot serve as given (too large, too long, missing a field)."""


class StaleBufferError(RuntimeError):
    """A buffer the captured graph reads was rebound after capture."""


@attrs.define
class _Stage:
    name: str
    dst: torch.Tensor
    fill: int


@attrs.define
class _Bound:
    plan: LoweredPlan
    stages: list[_Stage]
    out_args: list
    in_args: list
    crossing: list[torch.Tensor]
    meta: SimpleNamespace
    out_fields: list[str]
    captured_ptrs: list[int] | None = None
    checked: bool = False


def _ptrs(args: list) -> list[int]:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else 0 for a in args]


class CompiledAttentionBackend(AttentionBackend):
    def __init__(self, compiled: CompiledBackend, req_to_token: torch.Tensor, device=None, planners=None,
                 check_addresses: bool = True):
        self.compiled = compiled
        self.device = torch.device(device) if device is not None else req_to_token.device
        self.pools = {"req_to_token": req_to_token}
        self.planners = {**default_planners(), **(planners or {})}
        self.check_addresses = check_addresses
        self.max_bs = compiled.options.max_bs
        self.max_context_len = compiled.options.max_context_len
        self.inputs: dict[str, torch.Tensor] = {}
        self.fills: dict[str, int] = {}
        self.outbufs: dict[str, torch.Tensor] = {}
        self.crossbufs: dict[str, torch.Tensor] = {}
        self._bound: dict[tuple[ForwardMode, int], _Bound] = {}
        self._current: _Bound | None = None
        self._allocate()

    # --- static buffers ---
    def _alloc(self, t, numel: int) -> torch.Tensor:
        on_host = t.placement.on_host
        dev = torch.device("cpu") if on_host else self.device
        pin = on_host and self.device.type == "cuda"
        return torch.zeros(numel, dtype=t.dtype.torch, device=dev, pin_memory=pin)

    def _allocate(self) -> None:
        opts = self.compiled.options
        for g in self.compiled.generic.values():
            env = {**opts.symbols(), "bs": opts.max_bs}
            for i in g.inputs:
                if i.role is Role.batch and i.name not in self.inputs:
                    self.inputs[i.name] = self._alloc(i.type, i.type.numel(env))
                    self.fills[i.name] = i.fill if i.fill is not None else 0
                elif i.role is Role.pool:
                    self._check_pool(i)
            for o in g.outputs:
                t = g.types()[o.value]
                if o.field not in self.outbufs and not t.placement.on_host:
                    self.outbufs[o.field] = self._alloc(t, t.numel(env))

    def _check_pool(self, i) -> None:
        t = self.pools.get(i.name)
        if t is None:
            raise BatchError(f"the spec reads pool {i.name!r}; pass it to instantiate()")
        width = int(i.type.subs(self.compiled.options.symbols()).shape[1])
        if t.dim() != 2 or t.dtype != i.type.dtype.torch or width != t.shape[1]:
            raise BatchError(f"pool {i.name} must be {i.type.dtype.value}[rows, {self.max_context_len}] "
                             f"(max_context_len), got {tuple(t.shape)} {t.dtype}")

    @staticmethod
    def _view(buf: torch.Tensor, t, env) -> torch.Tensor:
        shape = [int(d) for d in t.subs(env).shape]
        return buf[: t.numel(env)].view(shape)

    def _bind(self, mode: ForwardMode, bs: int) -> _Bound:
        plan = self.compiled.plan(mode, bs)
        g, env = plan.graph, plan.graph.env
        types, nodes = g.types(), g.producers()
        values: dict[str, object] = {DEVICE: self.device, PLANNERS: self.planners, **self.pools}
        for i in g.inputs:
            if i.role is Role.batch:
                values[i.name] = self._view(self.inputs[i.name], i.type, env)
        field_of = {o.value: o.field for o in g.outputs}
        for name in plan.consts:
            n = nodes[name]
            buf = self.outbufs.get(field_of.get(name, ""))
            values[name] = eval_const(n, self.device, None if buf is None else self._view(buf, n.type, env))
        crossing = []
        for name in plan.crossing:
            t = types[name]
            if name not in self.crossbufs:
                self.crossbufs[name] = self._alloc(t, t.numel({**env, "bs": self.max_bs}))
            values[name] = self._view(self.crossbufs[name], t, env)
            crossing.append(values[name])
        for o in g.outputs:
            if o.field in self.outbufs:
                values[out_arg(o.field)] = self._view(self.outbufs[o.field], types[o.value], env)
        meta = SimpleNamespace(**{o.field: values.get(out_arg(o.field), values.get(o.value)) for o in g.outputs})
        stages = [_Stage(i.name, values[i.name], self.fills[i.name]) for i in g.inputs if i.role is Role.batch]
        return _Bound(plan, stages, [values[a] for a in plan.out_args], [values[a] for a in plan.in_args],
                      crossing, meta, [o.field for o in g.outputs if o.value in plan.out_results])

    def bound(self, mode: ForwardMode, bs: int) -> _Bound:
        key = (mode.graph_key, bs)
        b = self._bound.get(key)
        if b is None:
            b = self._bound[key] = self._bind(mode.graph_key, bs)
        return b

    # --- the contract ---
    def _stage(self, fb, b: _Bound) -> None:
        bs = fb.batch_size
        raw = 0 if fb.actual_forward_mode.is_idle() else getattr(fb, "raw_batch_size", bs)
        for s in b.stages:
            src = getattr(fb, s.name, None)
            if src is None:
                if raw:
                    raise BatchError(f"the batch has no {s.name}, which spec {b.plan.graph.name!r} reads")
                s.dst.fill_(s.fill)
                continue
            if src.data_ptr() == s.dst.data_ptr():
                continue  # already staged in place
            if src.shape[0] < raw:
                raise BatchError(f"{s.name} has {src.shape[0]} rows for a batch of {raw}")
            if raw:
                s.dst[:raw].copy_(src[:raw], non_blocking=True)
            if raw < bs:
                s.dst[raw:].fill_(s.fill)

    def _check_batch(self, fb) -> None:
        if fb.batch_size > self.max_bs:
            raise BatchError(f"batch size {fb.batch_size} exceeds max_bs={self.max_bs} the backend was compiled "
                             f"for; recompile with a larger --max-bs")
        cpu = getattr(fb, "seq_lens_cpu", None)
        raw = getattr(fb, "raw_batch_size", fb.batch_size)
        if cpu is not None and raw and not fb.actual_forward_mode.is_idle():
            longest = int(cpu[:raw].max())
            if longest > self.max_context_len:
                raise BatchError(f"a sequence of {longest} tokens exceeds max_context_len={self.max_context_len}; "
                                 f"recompile with a larger --max-context-len")

    def init_forward_metadata_out_graph(self, fb, in_capture: bool = False) -> None:
        self._check_batch(fb)
        b = self.bound(fb.forward_mode, fb.batch_size)
        self._stage(fb, b)
        results = b.plan.out_gm(*b.out_args) if b.plan.out_results else ()
        n_cross = len(b.crossing)
        for buf, val in zip(b.crossing, results[:n_cross], strict=True):
            buf.copy_(val, non_blocking=True)
        for field, val in zip(b.out_fields, results[n_cross:], strict=True):
            setattr(b.meta, field, val)
        if in_capture:
            b.captured_ptrs, b.checked = _ptrs(b.in_args), False
        elif self.check_addresses and b.captured_ptrs is not None and not b.checked:
            self._check_rebound(b)
        self._current = b
        self.forward_metadata = b.meta

    def _check_rebound(self, b: _Bound) -> None:
        """First replay after capture: every buffer the graph reads is still the captured one."""
        fresh = _ptrs(self._bind(self._mode_of(b), b.plan.graph.env["bs"]).in_args)
        if fresh != b.captured_ptrs:
            names = [a for a, x, y in zip(b.plan.in_args, fresh, b.captured_ptrs, strict=True) if x != y]
            raise StaleBufferError(f"buffers {names} of {b.plan.graph.name} were rebound after capture; the graph "
                                   "still reads the old ones. Write new values in place (copy_) instead.")
        b.checked = True

    def _mode_of(self, b: _Bound) -> ForwardMode:
        return next(m for (m, _), x in self._bound.items() if x is b)

    def init_forward_metadata_in_graph(self, fb) -> None:
        b = self._current
        if b is None or b.plan.graph.env["bs"] != fb.batch_size:
            raise RuntimeError("init_forward_metadata_in_graph before init_forward_metadata_out_graph for this batch")
        b.plan.in_gm(*b.in_args)
