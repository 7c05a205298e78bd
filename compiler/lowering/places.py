"""Where each value of a specialized plan lives: its region in the backend's spaces.

The graph carries its mode's layout at max_bs (pack-inputs, plan-buffers), offsets
relative to the mode; the backend gives each mode a base in every space. A region
is that place, typed and shaped at the plan's batch size: a prefix of the max_bs
region, so every size of a mode views the same memory.
"""

from __future__ import annotations

import sympy
import torch

from ..ir import Graph
from ..ir.analysis import kind_range
from ..ir.errors import InternalError
from ..ir.graph import Kind, Space, Use, aligned
from ..ir.types import SYMBOLS
from ..modes import ForwardMode
from .binding import Memory, Slot, Span


class LoweringError(InternalError):
    """A plan the lowering cannot place (a compiler bug, or a layout pass that did not run)."""


class Places:
    def __init__(self, g: Graph, mode: ForwardMode, base: dict[str, int], max_bs: int):
        self.g, self.mode, self.base, self.max_bs = g, mode, base, max_bs
        self.types = g.types()
        self.inputs = {i.name: i for i in g.inputs}
        self.bufs = {(b.space, b.use, b.name): b for b in g.buffers}
        self.staged = {v: b for b in g.buffers if b.space is Space.staging for v in b.values}

    def _span(self, space: Memory, ir_space: Space, offset: int, value: str) -> Span:
        t = self.types[value]
        return Span(space, self.base[ir_space.value] + offset, t.dtype.torch, tuple(int(d) for d in t.shape))

    def _buf(self, space: Space, use: Use, name: str):
        b = self.bufs.get((space, use, name))
        if b is None:
            raise LoweringError(f"{self.g.name}: no {space.value} buffer for {use.value} {name}; "
                                "pack-inputs and plan-buffers lay out every static buffer and must run")
        return b

    def batch(self, x: str) -> Span:
        b = self.staged.get(x)
        if b is None:
            raise LoweringError(f"{self.g.name}: batch input %{x} has no staging slot; pack-inputs must run")
        host = self.inputs[x].type.placement.on_host
        return self._span(Memory.staging_host if host else Memory.staging_dev, Space.staging, b.offset, x)


    def feed(self, x: str) -> Span:
        """A guarded input's feed: its arena region (guard-inputs, plan-buffers) at this plan's size."""
        b = self._buf(Space.arena, Use.feed, x)
        return self._span(Memory.arena, Space.arena, b.offset, x)

    def generation(self) -> Span | None:
        """The staging slot the runtime writes each step's size into, host side (guard-inputs)."""
        b = next((b for b in self.g.buffers if b.space is Space.staging and b.values and
                  self.inputs[b.values[0]].role.guard), None)
        return None if b is None else self._span(Memory.staging_host, Space.staging, b.offset, b.values[0])

    def generation_for(self) -> int:
        """The size of the graph that pads a staging of this plan (ops_guard.pad_target; its own size where it has a
        graph of its own)."""
        from ..ir import Op
        from ..ir.ops_guard import pad_target

        n = next((n for n in self.g.nodes if n.op is Op.ingest), None)
        return 0 if n is None else pad_target(self.g.env["bs"], n.a["captured"])

    def guards(self) -> tuple[tuple[int, str], ...]:
        """The record's codes of this plan's ingest nodes, and the fields they check."""
        from ..ir import Op
        from ..ir.ops_guard import GENERATION

        out = []
        for n in self.g.nodes:
            if n.op is Op.ingest:
                out += [(int(n.a["code"]), n.a["field"]), (int(n.a["code"]) | GENERATION, "the staging generation")]
        return tuple(out)

    def field(self, f: str) -> Span:
        b = self.bufs.get((Space.host, Use.field, f))
        if b is not None:
            return self._span(Memory.host, Space.host, b.offset, b.values[0])
        b = self._buf(Space.arena, Use.field, f)
        return self._span(Memory.arena, Space.arena, b.offset, b.values[0])

    def value(self, v: str) -> Span:
        b = self.bufs.get((Space.arena, Use.value, v)) or self._buf(Space.arena, Use.crossing, v)
        return self._span(Memory.arena, Space.arena, b.offset, v)

    def host(self, v: str) -> Span | None:
        """Where an out_graph host value is written: its own buffer, or its first field's."""
        b = self.bufs.get((Space.host, Use.host, v))
        if b is not None:
            return self._span(Memory.host, Space.host, b.offset, v)
        fields = [f for f in self.fields_of(v) if (Space.host, Use.field, f) in self.bufs]
        return self.field(fields[0]) if fields else None

    def fields_of(self, v: str) -> list[str]:
        """The fields bound to value ``v`` that have a buffer, in output order."""
        return [o.field for o in self.g.outputs if o.value == v and ((Space.arena, Use.field, o.field) in self.bufs
                                                                    or (Space.host, Use.field, o.field) in self.bufs)]

    def const(self, c: str) -> Span:
        """A constant every size shares: in its (first) field's buffer, else its own."""
        fields = self.fields_of(c)
        if self.types[c].placement.on_host and not fields:
            r = self.host(c)
            if r is None:
                raise LoweringError(f"{self.g.name}: host constant %{c} has no host buffer")
            return r
        return self.field(fields[0]) if fields else self.value(c)

    def locals(self, names) -> dict[str, Span]:
        """This plan's own constants (values that differ per size): buffers of their own."""
        out, end = {}, {Memory.local_dev: 0, Memory.local_host: 0}
        for c in names:
            t = self.types[c]
            space = Memory.local_host if t.placement.on_host else Memory.local_dev
            r = Span(space, end[space], t.dtype.torch, tuple(int(d) for d in t.shape))
            out[c] = r
            end[space] += aligned(r.nbytes)
        return out

    @staticmethod
    def local_bytes(regions: dict[str, Span]) -> tuple[tuple[Memory, int], ...]:
        end: dict[Memory, int] = {}
        for r in regions.values():
            end[r.space] = max(end.get(r.space, 0), r.offset + aligned(r.nbytes))
        return tuple(sorted(end.items(), key=lambda kv: kv[0].value))

    # --- staging ---
    def slots(self) -> tuple[Slot, ...]:
        out = []
        slot_of = {v: b.name for b in self.g.buffers if b.space is Space.staging for v in b.values}
        for b in (b for b in self.g.buffers if b.space is Space.staging):
            ins = [self.inputs[v] for v in b.values]
            if any(i.role.guard for i in ins):  # the generation: the runtime's own, not a batch field
                continue
            dev = next((i for i in ins if not i.type.placement.on_host), None)
            first = ins[0]
            per_row = b.nbytes // max(1, self.max_bs * first.type.dtype.torch.itemsize)
            n = per_row * self.g.env["bs"]
            base = self.base[Space.staging.value] + b.offset
            host = Span(Memory.staging_host, base, first.type.dtype.torch, (n,))
            kind = next((i.kind for i in ins if i.kind is not Kind.value), Kind.value)
            declared = next((i.upper(self.inputs) for i in ins if i.hi is not None), None)
            lo, hi, why, fix = self._bounds(kind, declared, first)
            rel_in = next((i for i in ins if i.relation is not None), None)
            rel = None if rel_in is None else rel_in.relation
            guarded = dev is not None and f"{dev.name}__feed" in self.inputs
            out.append(Slot(b.name, dev.name if dev is not None and dev.name != b.name else None, host,
                            None if dev is None else Span(Memory.staging_dev, base, host.dtype, (n,)),
                            per_row, per_row * self.max_bs, first.fill or 0, kind, lo, hi, why, fix,
                            None if rel is None else self._relation(rel_in.name, slot_of[rel[0]], rel),
                            self.feed(f"{dev.name}__feed") if guarded else None,
                            f"{dev.name}__engine" if guarded else None))
        return tuple(out)

    def _env(self) -> dict:
        """The config symbols' values (bs stays a symbol: one layout serves every size)."""
        return {SYMBOLS[k]: v for k, v in self.g.env.items() if k in SYMBOLS and k != "bs"}

    def _relation(self, name: str, other_slot: str, rel) -> tuple[str, sympy.Expr, str]:
        """A per-row bound for the Slot: the other slot, the bound of name - other, and how the error says it."""
        bound = sympy.sympify(rel[1].xreplace(self._env()))
        return other_slot, bound, f"{name} - {rel[0]} <= {bound}"

    def _bounds(self, kind: Kind, declared, i) -> tuple[int, sympy.Expr, str, str]:
        env = self._env()
        lo, hi = kind_range(kind, declared, i.type.dtype)
        hi = sympy.sympify(hi.xreplace(env))
        if kind is Kind.length:
            L, room = self.g.env["L"], sympy.expand(SYMBOLS["L"] - (declared if declared is not None else
                                                                   SYMBOLS["L"]))
            fix = "recompile with a larger --max-context-len, or shorten the request"
            if room == 0:
                why = f"max_context_len={L}"
            elif room.is_Integer and room > 0:
                why = f"max_context_len={L} less the {room} slots {self.mode.name.lower()} reads past each sequence"
            elif declared == SYMBOLS["D"]:
                why = f"num_draft_tokens={self.g.env['D']}"
                fix = "a request extends by at most num_draft_tokens tokens; recompile with a larger --num-draft-tokens"
            else:
                why = str(declared)
            return lo, hi, why, fix
        if kind is Kind.row:
            return lo, hi, "the rows of req_to_token (row 0 is reserved for padding)", ""
        if kind is Kind.slot:
            return lo, hi, "the KV slots of the pool", ""
        return lo, hi, f"the range of {i.type.dtype.value}", ""

    def copies(self) -> tuple[tuple[Span, Span], ...]:
        """The mode's staging bytes: one packed host->device copy per step, of every input's rows to
        max_bs (the padding included, so no size's graph reads rows an earlier step left: bug class 19;
        a few KiB at most, one copy either way)."""
        staged = [b for b in self.g.buffers if b.space is Space.staging]
        if not any(not self.inputs[v].type.placement.on_host for b in staged for v in b.values):
            return ()
        span = max(b.offset + b.nbytes for b in staged)
        base = self.base[Space.staging.value]
        return ((Span(Memory.staging_dev, base, torch.uint8, (span,)), Span(Memory.staging_host, base, torch.uint8,
                                                                              (span,))),)

