from __future__ import annotations

import attrs
import sympy

from ..ir import Graph, Input, Node, Op, Region, Role
from ..ir.analysis import dtype_range, kind_range
from ..ir.graph import Buffer, Kind, Space, Use, aligned
from ..ir.ops_guard import GENERATION
from ..ir.types import SYMBOLS, DType, Placement, TensorType
from ..modes import ForwardMode
from .registry import PassContext, register_pass

WORD, GEN, RECORD = "guard_word", "guard_generation", "guard_record"
_SCALAR = TensorType(DType.int32, (), Placement.device)
_GENERATION = TensorType(DType.int32, (2,), Placement.device)
_RECORD = TensorType(DType.int64, (4,), Placement.pinned)


def guard_code(mode: ForwardMode, k: int) -> int:
    """The record's code of the ``k``-th guarded input of ``mode``'s graphs (``| 0xFF``: its generation)."""
    return (list(ForwardMode).index(mode) << 8) | k


@register_pass("guard-inputs")
def guard_inputs(g: Graph, ctx: PassContext) -> Graph:
    """Requires a mode-generic graph whose staging pack-inputs laid out. Guarantees that in_graph reads every
    device-resident batch input through an ``ingest`` node at its head (ops_guard.py): the value staged from the
    host, fed from the device, or read in place from the engine's own buffer, checked against its kind's range on
    the device, a bad value replaced by a safe one and recorded. Adds, per guarded input ``x``, ``x__feed`` (the
    plan's int64 copy of values handed over on the device) and ``x__engine`` (the engine's buffer, bound where a
    graph is captured on one), and once per graph the engine word, the generation (a staging slot of its own: the
    batch size each step stages for) and the record. in_graph nodes and outputs that read ``x`` read ``x__in``;
    out_graph keeps reading what was staged.

    Why a pass: what a captured graph runs is then in the IR, fused like any op into the step's first kernel,
    and shown by every dump; the runtime only binds the inputs and writes the word and the generation."""
    inputs = {i.name: i for i in g.inputs}
    in_graph = [n for n in g.nodes if n.region is Region.in_graph]
    reads = {x for n in in_graph for x in n.inputs} | {o.value for o in g.outputs}
    guarded = [i for i in g.inputs if i.role is Role.batch and not i.type.placement.on_host and i.name in reads
               and i.type.dtype in (DType.int32, DType.int64)]  # an index, a length: what a check has a range for
    if not guarded or any(i.role.guard for i in g.inputs):
        return g
    if len(guarded) >= GENERATION:
        raise ValueError(f"{g.name}: {len(guarded)} guarded inputs; the record's codes hold {GENERATION - 1}")
    slot_of = {v: b for b in g.buffers if b.space is Space.staging for v in b.values}
    pools = [i for i in g.inputs if i.role is Role.pool]
    env = {SYMBOLS[k]: v for k, v in ctx.options.symbols().items() if k in SYMBOLS and k != "bs"}
    new_inputs = [Input(WORD, _SCALAR, Role.word), Input(GEN, _GENERATION, Role.generation),
                  Input(RECORD, _RECORD, Role.record)]
    # a row range of an input (a TBO child's rows) is checked where it is sliced, so each child's check joins the
    # child's own kernel; the rest of in_graph reads the whole input checked
    names = {i.name for i in guarded}
    ranges = {n.name: n for n in in_graph if n.op is Op.slice and n.inputs[0] in names}
    # a lookup of an input (a drafter's branches reading their request's row) reads it at the rows it names,
    # checked there: in the branches' own kernel
    lookups = {n.name: n for n in in_graph if n.op is Op.lookup and n.inputs[0] in names and len(n.type.shape) == 1}
    whole = {x for n in in_graph if n.name not in ranges for x in (n.inputs[1:] if n.name in lookups else n.inputs)}
    whole |= {o.value for o in g.outputs}
    heads, after, renamed, replaced = [], {}, {}, {}
    for k, i in enumerate(guarded):
        a, extra = _check(i, k, slot_of, inputs, pools, env, ctx)
        t64 = attrs.evolve(i.type, dtype=DType.int64)
        feed, engine = f"{i.name}__feed", f"{i.name}__engine"
        new_inputs += [Input(feed, t64, Role.feed), Input(engine, t64, Role.engine)]
        if i.name in whole:
            heads.append(Node(f"{i.name}__in", Op.ingest, (i.name, feed, engine, WORD, GEN, RECORD, *extra),
                              dict(a, index=False, sized=False), i.type, Region.in_graph, origin=ORIGIN))
            renamed[i.name] = f"{i.name}__in"
        for r in (n for n in ranges.values() if n.inputs[0] == i.name):
            views = [Node(f"{r.name}__{w}", Op.slice, (src,), r.attrs, attrs.evolve(r.type, dtype=DType.int64),
                          Region.in_graph, origin=ORIGIN) for w, src in (("feed", feed), ("engine", engine))]
            check = Node(f"{r.name}__in", Op.ingest, (r.name, *(v.name for v in views), WORD, GEN, RECORD, *extra,
                                                      i.name), dict(a, field=r.name, index=False, sized=True), r.type,
                         Region.in_graph, origin=ORIGIN)
            after[r.name] = [*views, check]
            renamed[r.name] = check.name
        for u in (n for n in lookups.values() if n.inputs[0] == i.name):
            replaced[u.name] = Node(u.name, Op.ingest, (i.name, feed, engine, WORD, GEN, RECORD, *extra, u.inputs[1]),
                                    dict(a, index=True, sized=False), u.type, Region.in_graph, origin=ORIGIN)
    nodes = list(heads)
    for n in g.nodes:
        if n.name in replaced:
            n = replaced[n.name]
        elif n.region is Region.in_graph and n.name not in ranges:
            n = attrs.evolve(n, inputs=tuple(renamed.get(x, x) for x in n.inputs))
        elif n.op is Op.host_call:  # a planner plans into fields: the checked values the outputs now name
            n = attrs.evolve(n, attrs={**n.a, "binds": n.a["binds"].rename(lambda v: renamed.get(v, v))})
        nodes += [n, *after.get(n.name, ())]
    outputs = tuple(attrs.evolve(o, value=renamed.get(o.value, o.value)) for o in g.outputs)
    end = max((aligned(b.end) for b in g.buffers if b.space is Space.staging), default=0)
    gen_slot = Buffer(Space.staging, Use.input, GEN, (GEN,), end, 8)
    return attrs.evolve(g, inputs=g.inputs + tuple(new_inputs), nodes=tuple(nodes), outputs=outputs,
                        buffers=g.buffers + (gen_slot,))


ORIGIN = "pass:guard-inputs"


def _check(i: Input, k: int, slot_of: dict, inputs: dict, pools: list, env: dict, ctx) -> tuple[dict, list[str]]:
    """An ingest's attributes for input ``i`` (its slot's kind and bound, with its mirror's), and the pools its
    bound names (R, N): (attributes, the pool operands)."""
    mates = [inputs[v] for v in slot_of[i.name].values]  # the input and its host mirror share one slot
    kind = next((m.kind for m in mates if m.kind is not Kind.value), Kind.value)
    declared = next((m.upper(inputs) for m in mates if m.hi is not None), None)
    lo, hi = kind_range(kind, declared, i.type.dtype)
    hi = sympy.sympify(hi.xreplace(env))
    extra: list[str] = []
    hi_of: list[int] = []
    for s in sorted(hi.free_symbols, key=lambda s: s.name):  # R, N: the extents of a pool
        at = next(((p, a) for p in pools for a, d in enumerate(p.type.shape) if d == s), None)
        if at is None:  # no pool says (no slot table: N unbound): the check keeps to the dtype's range
            return _attrs(i, k, kind, lo, sympy.Integer(dtype_range(i.type.dtype)[1]), [], ctx), []
        if at[0].name not in extra:
            extra.append(at[0].name)
        hi_of += [6 + extra.index(at[0].name), at[1]]
    return _attrs(i, k, kind, lo, hi, hi_of, ctx), extra


def _attrs(i: Input, k: int, kind: Kind, lo: int, hi, hi_of: list[int], ctx) -> dict:
    env = {SYMBOLS[n]: v for n, v in ctx.options.symbols().items() if n in SYMBOLS and n != "bs"}
    # [k*bs]: k values a request (verify's drafts, a drafter's steps), k a config number
    per_row = sympy.expand(i.type.shape[0].xreplace(env) / SYMBOLS["bs"])
    return dict(field=i.name, code=guard_code(ctx.mode, k), lo=lo, hi=hi, hi_of=tuple(hi_of),
                engine_lo=0 if kind is Kind.row else lo, clamp=kind is Kind.length, per_row=int(per_row),
                captured=tuple(ctx.options.sizes))
