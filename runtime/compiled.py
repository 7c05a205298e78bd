"""A compiled backend behind the three-method contract.

Static buffers are allocated once at maximum size: the packed staging pair
for batch inputs (host side pinned on a GPU), one buffer per in_graph
metadata output (written in place by the captured work), one per out_graph
value the graph reads. Every (mode, bs) plan binds views of those buffers
once; ``forward_metadata`` is the bound plan's field namespace, whose
tensors are those views.
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import torch

from attnmeta.compiler import CompiledBackend
from attnmeta.compiler.ir import Role
from attnmeta.compiler.lowering.fx import DEVICE, PLANNERS, LoweredPlan, eval_const, out_arg, scratch_arg
from attnmeta.compiler.modes import ForwardMode

from .backend import AttentionBackend
from .planners import default_planners, with_key
from .staging import BatchError, Slot, Stager

__all__ = ["BatchError", "CompiledAttentionBackend", "StaleBufferError"]


class StaleBufferError(RuntimeError):
    """A buffer the captured graph reads was rebound after capture."""


@attrs.define
class _Bound:
    mode: ForwardMode
    plan: LoweredPlan
    stager: Stager
    out_fn: object  # the out_graph module's forward (no nn.Module call overhead)
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
                 check_addresses: bool = True, pools: dict | None = None):
        self.compiled = compiled
        self.device = torch.device(device) if device is not None else req_to_token.device
        self.pools = {"req_to_token": req_to_token, **(pools or {})}
        self.planners = {**default_planners(), **{k: with_key(f) for k, f in (planners or {}).items()}}
        self.check_addresses = check_addresses
        self.max_bs = compiled.options.max_bs
        self.max_context_len = compiled.options.max_context_len
        self.env = {**compiled.options.symbols(), "bs": self.max_bs}
        self.inputs: dict[tuple[ForwardMode, str], torch.Tensor] = {}  # static, at max_bs
        self.outbufs: dict[str, torch.Tensor] = {}
        self.crossbufs: dict[str, torch.Tensor] = {}
        self.scratchbufs: dict[tuple, torch.Tensor] = {}  # what one fused kernel stores for another
        self.hostbufs: dict[str, torch.Tensor] = {}  # out_graph host values, at max_bs
        self.consts: dict[tuple, torch.Tensor] = {}
        self._bound: dict[tuple[ForwardMode, int], _Bound] = {}
        self._current: _Bound | None = None
        self.planning: _Bound | None = None
        self._event: list = [None, None]  # (event after the last staging copy, the stream it was recorded on)
        self._allocate()

    # --- static buffers ---
    def _alloc(self, dtype: torch.dtype, numel: int, on_host: bool) -> torch.Tensor:
        dev = torch.device("cpu") if on_host else self.device
        return torch.zeros(numel, dtype=dtype, device=dev, pin_memory=on_host and self.device.type == "cuda")

    def _allocate(self) -> None:
        packed = [i for g in self.compiled.generic.values() for i in g.inputs if i.offset is not None]
        size = max((i.offset + i.type.numel(self.env) * i.type.dtype.torch.itemsize for i in packed), default=0)
        self.staging_host = self._alloc(torch.uint8, size, on_host=True)
        self.staging_dev = self._alloc(torch.uint8, size, on_host=False)
        for mode, g in self.compiled.generic.items():
            for i in g.inputs:
                if i.role is Role.pool:
                    self._check_pool(i)
                    continue
                t, n = i.type.dtype.torch, i.type.numel(self.env)
                if i.offset is None:  # pack-inputs disabled: a private host/device pair per input
                    self.inputs[(mode, "host:" + i.name)] = self._alloc(t, n, on_host=True)
                    buf = self._alloc(t, n, on_host=i.type.placement.on_host)
                else:
                    span = slice(i.offset, i.offset + n * t.itemsize)
                    buf = (self.staging_host if i.type.placement.on_host else self.staging_dev)[span].view(t)
                    self.inputs[(mode, "host:" + i.name)] = self.staging_host[span].view(t)
                self.inputs[(mode, i.name)] = buf
        arena = max((o.offset + self._nbytes(g, o) for g in self.compiled.generic.values() for o in g.outputs
                     if o.offset is not None), default=0)
        self.arena = self._alloc(torch.uint8, arena, on_host=False)  # plan-buffers: all static outputs
        for g in self.compiled.generic.values():
            for o in g.outputs:
                t = g.types()[o.value]
                if o.field in self.outbufs or t.placement.on_host:
                    continue
                if o.offset is None:  # plan-buffers disabled: a buffer of its own
                    self.outbufs[o.field] = self._alloc(t.dtype.torch, t.numel(self.env), on_host=False)
                else:
                    self.outbufs[o.field] = self.arena[o.offset : o.offset + self._nbytes(g, o)].view(t.dtype.torch)

    def _nbytes(self, g, o) -> int:
        t = g.types()[o.value]
        return t.numel(self.env) * t.dtype.torch.itemsize

    def _check_pool(self, i) -> None:
        t = self.pools.get(i.name)
        if t is None:
            raise BatchError(f"the spec reads pool {i.name!r}; pass it to instantiate(pools={{{i.name!r}: ...}})")
        shape = i.type.subs(self.compiled.options.symbols()).shape
        fixed = [(k, int(d)) for k, d in enumerate(shape) if d.is_Integer]  # R and N stay free
        if t.dim() != len(shape) or t.dtype != i.type.dtype.torch or any(t.shape[k] != d for k, d in fixed):
            want = ", ".join(str(d) if d.is_Integer else "rows" for d in shape)
            raise BatchError(f"pool {i.name} must be {i.type.dtype.value}[{want}] (the L it was compiled for), "
                             f"got {tuple(t.shape)} {t.dtype}")

    @staticmethod
    def _view(buf: torch.Tensor, t, env) -> torch.Tensor:
        shape = [int(d) for d in t.subs(env).shape]
        return buf[: t.numel(env)].view(shape)

    def _stager(self, mode: ForwardMode, g, env) -> Stager:
        slots, seen, nbytes = [], set(), 0
        room = self.compiled.spec.headroom(mode, self.compiled.options)  # columns a step reads past seq_lens
        why = f"max_context_len={self.max_context_len}" + (
            f" less the {room} slots {mode.name.lower()} reads past each sequence" if room else "")
        batch = [i for i in g.inputs if i.role is Role.batch]
        for i in batch:
            key = i.offset if i.offset is not None else i.name
            if key in seen:
                continue  # a device field and its host mirror share one slot
            seen.add(key)
            twin = [j for j in batch if (j.offset if j.offset is not None else j.name) == key]
            dev = next((j for j in twin if not j.type.placement.on_host), None)
            host = self._view(self.inputs[(mode, "host:" + i.name)], i.type, env)
            seq = i.source in ("seq_lens", "seq_lens_cpu")
            slots.append(Slot(i.source, (dev or i).name, host,
                              None if dev is None else self._view(self.inputs[(mode, dev.name)], dev.type, env),
                              i.fill if i.fill is not None else 0,
                              self.max_context_len - room if seq else None, why,
                              host.numel() // env["bs"] if env["bs"] else 1))
            if i.offset is not None:
                nbytes = max(nbytes, i.offset + host.numel() * host.element_size())
        if any(i.offset is None for i in batch):  # unpacked: one copy per input, the cost pack-inputs removes
            return Stager(slots, [(s.dev, s.host) for s in slots if s.dev is not None], self._event)
        return Stager(slots, [(self.staging_dev[:nbytes], self.staging_host[:nbytes])], self._event)

    def _bind(self, mode: ForwardMode, bs: int) -> _Bound:
        plan = self.compiled.plan(mode, bs)
        g, env = plan.graph, plan.graph.env
        types, nodes = g.types(), g.producers()
        values: dict[str, object] = {DEVICE: self.device, PLANNERS: self.planners, **self.pools}
        for i in g.inputs:
            if i.role is Role.batch:
                values[i.name] = self._view(self.inputs[(mode, i.name)], i.type, env)
        for name, src, lo, hi in plan.views:  # static row ranges of static buffers: views, taken once
            values[name] = values[src][lo:hi]
        fields_of: dict[str, list[str]] = {}
        for o in g.outputs:
            fields_of.setdefault(o.value, []).append(o.field)
        for name in plan.consts:  # evaluated once, then kept: they never change (and buffers the
            n = nodes[name]  # engine writes into, like the verify mask, stay written)
            # one constant may serve several fields (cse merges equal ones): each field's buffer gets it
            targets = [f for f in fields_of.get(name, []) if f in self.outbufs] or [None]
            for f in targets:
                key = (mode, f or name, n.type)
                if key not in self.consts:
                    out = None if f is None else self._view(self.outbufs[f], n.type, env)
                    self.consts[key] = eval_const(n, self.device, [values[x] for x in n.inputs], out)
            values[name] = self.consts[(mode, targets[0] or name, n.type)]
        generic = self.compiled.generic[mode].types()  # buffers are sized from the generic type at max_bs
        for name in plan.scratch:
            if (mode, name) not in self.scratchbufs:
                n = generic[name].numel(self.env)
                self.scratchbufs[(mode, name)] = self._alloc(types[name].dtype.torch, n, False)
            values[scratch_arg(name)] = self._view(self.scratchbufs[(mode, name)], types[name], env)
        crossing = []
        for name in plan.crossing:
            t = types[name]
            if name not in self.crossbufs:
                self.crossbufs[name] = self._alloc(t.dtype.torch, generic[name].numel(self.env), False)
            values[name] = self._view(self.crossbufs[name], t, env)
            crossing.append(values[name])
        for o in g.outputs:
            if o.field in self.outbufs:
                values[out_arg(o.field)] = self._view(self.outbufs[o.field], types[o.value], env)
        for a in plan.out_args:
            if a.startswith("hbuf__"):
                name, t = a[len("hbuf__"):], types[a[len("hbuf__"):]]
                if name not in self.hostbufs:
                    self.hostbufs[name] = torch.zeros(generic[name].numel(self.env), dtype=t.dtype.torch)
                values[a] = self._view(self.hostbufs[name], t, env)
        meta = SimpleNamespace(**{o.field: values.get(out_arg(o.field), values.get(o.value)) for o in g.outputs})
        return _Bound(mode, plan, self._stager(mode, g, env), plan.out_gm.forward,
                      [values[a] for a in plan.out_args], [values[a] for a in plan.in_args], crossing, meta,
                      [o.field for o in g.outputs if o.value in plan.out_results])

    def bound(self, mode: ForwardMode, bs: int) -> _Bound:
        key = (mode.graph_key, bs)
        b = self._bound.get(key)
        if b is None:
            b = self._bound[key] = self._bind(mode.graph_key, bs)
        return b

    # --- the contract ---
    def init_forward_metadata_out_graph(self, fb, in_capture: bool = False) -> None:
        raw = 0 if fb.actual_forward_mode.is_idle() else getattr(fb, "raw_batch_size", fb.batch_size)
        b = self._bound.get((fb.forward_mode.graph_key, fb.batch_size))
        if b is None:
            if fb.batch_size > self.max_bs:
                raise BatchError(f"batch size {fb.batch_size} exceeds max_bs={self.max_bs} the backend was "
                                 f"compiled for; recompile with a larger --max-bs")
            b = self.bound(fb.forward_mode, fb.batch_size)
        b.stager.stage(fb, fb.batch_size, raw)
        self.planning = b  # planners that bind device buffers (FlashInfer) read this binding's views
        if b.plan.out_results:
            results = b.out_fn(*b.out_args)
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
        fresh = _ptrs(self._bind(b.mode, b.plan.graph.env["bs"]).in_args)
        if fresh != b.captured_ptrs:
            names = [a for a, x, y in zip(b.plan.in_args, fresh, b.captured_ptrs, strict=True) if x != y]
            raise StaleBufferError(f"buffers {names} of {b.plan.graph.name} were rebound after capture; the graph "
                                   "still reads the old ones. Write new values in place (copy_) instead.")
        b.checked = True

    def set_stream(self, stream) -> None:
        """Staging records its hazard event on the stream that was current at the first step; an engine
        that moves metadata preparation to another stream says so here."""
        self._event[:] = [torch.cuda.Event(), stream]

    def init_forward_metadata_in_graph(self, fb) -> None:
        b = self._current
        if b is None or b.plan.graph.env["bs"] != fb.batch_size:
            raise RuntimeError("init_forward_metadata_in_graph before init_forward_metadata_out_graph for this batch")
        b.plan.in_gm(*b.in_args)
