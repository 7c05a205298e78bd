"""check-split: the rules that keep a spec's out_graph/in_graph split
correct under CUDA-graph capture and replay. Each rule has a stable id;
every violation names the node, its spec origin, the rule and a fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from ..ir import OPS, Graph, Op, Region, Role
from ..ir.analysis import index_roles, value_ranges
from ..ir.errors import Diagnostic, UserError
from ..ir.types import concrete
from .registry import PassContext, register_pass


@attrs.frozen
class Violation(Diagnostic):
    """A check-split diagnostic: ``rule`` is the rule id, ``node`` the value it is about."""

    @property
    def node(self) -> str:
        return self.value


class SplitError(UserError):
    """The spec's split is illegal; ``violations`` holds every problem found."""

    rule = "check-split"

    def __init__(self, graph: str, violations: list[Violation]):
        self.violations = violations
        body = "\n".join(f"  {v}" for v in violations)
        super().__init__(f"check-split rejected {graph!r} with {len(violations)} violation(s):\n{body}", violations)


@attrs.frozen
class Facts:
    """What the rules know beyond the specialized graph: the values that are one host number at
    every size (0-d, or [1] in the mode-generic graph: a [bs] tensor at bs 1 is not one)."""

    scalars: frozenset[str]
    roles: dict  # batch input -> the index roles its values reach (analysis.index_roles)

    @classmethod
    def of(cls, g: Graph, generic: Graph | None = None) -> Facts:
        src = (generic or g).types()
        one = {x for x, t in src.items() if t.placement.on_host and t.dtype.value != "opaque" and not t.is_dynamic
               and (t.shape == () or generic is not None and all(d == 1 for d in t.shape))}
        return cls(frozenset(one), index_roles(generic or g))


Rule = Callable[[Graph, Facts], Iterator[Violation]]
RULES: dict[str, Rule] = {}


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES[rule_id] = fn
        return fn

    return deco


# Ops with a rule of their own are reported there only, so each defect gets its most specific id.
_SPECIFIC = {Op.host_call: "planner-not-replayed", Op.split_at: "capture-dependent-split"}


@rule("dynamic-shape-in-graph")
def _dynamic(g: Graph, f: Facts) -> Iterator[Violation]:
    for n in g.region_nodes(Region.in_graph):
        if n.type.is_dynamic and n.op not in _SPECIFIC:
            yield Violation("dynamic-shape-in-graph", n.name, n.origin,
                            f"{n.op.value} produces {n.type}, whose extent depends on data; a captured graph "
                            "replays fixed shapes",
                            "size it by a static bound (e.g. capacity=max_bs*L) and guard rows on device, "
                            "or move the step to out_graph")


@rule("host-value-in-graph")
def _host_value(g: Graph, f: Facts) -> Iterator[Violation]:
    types = g.types()
    mapped = {i.name for i in g.inputs if i.role is Role.record}  # the device-fault record: the device writes it
    for n in g.region_nodes(Region.in_graph):
        host_ins = [x for x in n.inputs if types[x].placement.on_host and x not in f.scalars and x not in mapped]
        if host_ins:
            yield Violation("host-value-in-graph", n.name, n.origin,
                            f"in_graph {n.op.value} reads host value(s) "
                            f"{', '.join('%' + x for x in host_ins)}; replay would not see new host data",
                            "read the device tensor instead (seq_lens, not seq_lens_cpu), or copy the host "
                            "value into a static device buffer in out_graph")
        elif n.type.placement.on_host and n.op not in (Op.item, Op.to_host, *_SPECIFIC):
            yield Violation("host-value-in-graph", n.name, n.origin,
                            f"in_graph {n.op.value} writes a host tensor ({n.type})",
                            "produce a device tensor in in_graph, or move the step to out_graph")


@rule("unrecordable-op-in-graph")
def _unrecordable(g: Graph, f: Facts) -> Iterator[Violation]:
    for n in g.region_nodes(Region.in_graph):
        info = OPS[n.op]
        if not info.recordable and n.op not in _SPECIFIC:
            what = "synchronises device and host" if info.syncs else "cannot be captured"
            yield Violation("unrecordable-op-in-graph", n.name, n.origin,
                            f"{n.op.value} {what}; inside capture it raises or is frozen at its capture value",
                            "compute it in out_graph from a host mirror (e.g. seq_lens_cpu), "
                            "or replace it by a static-shape device op")


@rule("graph-to-host-edge")
def _graph_to_host(g: Graph, f: Facts) -> Iterator[Violation]:
    """A host step consuming device data: an in_graph result (it only exists after replay), or a
    device value read on the host, which blocks on the device every step (a planner fed device
    indptrs: FlashInfer's plan() copies them back)."""
    types, prod = g.types(), g.producers()
    for n in g.region_nodes(Region.out_graph):
        from_graph = [x for x in n.inputs if x in prod and prod[x].region is Region.in_graph]
        if from_graph:
            yield Violation("graph-to-host-edge", n.name, n.origin,
                            f"out_graph {n.op.value} consumes in_graph result(s) "
                            f"{', '.join('%' + x for x in from_graph)}, which only exist after replay",
                            "compute the value in out_graph from host mirrors, or move this step into in_graph")
            continue
        device_ins = [x for x in n.inputs if not types[x].placement.on_host]
        if device_ins and (n.op is Op.host_call or n.type.placement.on_host):
            what = f"planner {n.a['target']!r}" if n.op is Op.host_call else f"out_graph {n.op.value}"
            yield Violation("graph-to-host-edge", n.name, n.origin,
                            f"{what} reads device value(s) {', '.join('%' + x for x in device_ins)} on the host: a "
                            "device->host copy that blocks every step",
                            "compute it from host mirrors (seq_lens_cpu, req_pool_indices_cpu) in out_graph")


@rule("missing-fill-value")
def _missing_fill(g: Graph, f: Facts) -> Iterator[Violation]:
    """Every padded input declares a fill that is provably safe for what its values index: the
    reserved pool row 0 (or a negative sentinel: every row index is guarded on device), a length
    >= 0, the reserved KV slot 0."""
    for i in g.inputs:
        if i.role is not Role.batch:
            continue
        r, fill = f.roles.get(i.name, set()), i.fill
        if fill is None:
            yield Violation("missing-fill-value", i.name, i.origin,
                            f"batch input {i.name} is padded to the captured batch size but declares no fill value",
                            "declare a safe fill, e.g. fill=1 for seq_lens, fill=0 for req_pool_indices "
                            "(row 0 is reserved and all zero)")
        elif "row" in r and fill > 0:
            yield Violation("missing-fill-value", i.name, i.origin,
                            f"fill={fill} of {i.name} is a live pool row: padded rows would read request row {fill}'s "
                            "KV slots (and write through them)",
                            "fill=0: row 0 of req_to_token is reserved for padding and stays all zero")
        elif "slot" in r and fill != 0:
            yield Violation("missing-fill-value", i.name, i.origin,
                            f"fill={fill} of {i.name} is {'a live' if fill > 0 else 'no'} KV slot: padded rows would "
                            f"{'write into live KV' if fill > 0 else 'write at a negative slot outside the cache'}",
                            "fill=0: slot 0 is reserved for padding")
        elif "length" in r and fill < 0:
            yield Violation("missing-fill-value", i.name, i.origin,
                            f"fill={fill} of {i.name} is a negative length: every later row's indptr moves back, so "
                            "padded rows overwrite live rows' indices",
                            "fill=1 (or 0): a padded row is a one-token (or empty) sequence")
        elif not r and fill != 0 and i.type.dtype.value.startswith(("i", "u")) and _passed_through(g, i.name):
            field = _passed_through(g, i.name)
            yield Violation("missing-fill-value", i.name, i.origin,
                            f"fill={fill} of {i.name}: nothing in the spec indexes with it, but it reaches field "
                            f"{field!r}, which the engine's kernels read; what its values index there (a KV slot to "
                            "write, a pool row) is not declared, so a nonzero fill may name live data",
                            "declare what it indexes (kind=Kind.slot / Kind.row / Kind.length) so its fill is "
                            "checked, or fill=0 (the reserved slot and row)")


def _passed_through(g: Graph, name: str) -> str | None:
    """The first output field whose value is input ``name``'s values moved, cast or sliced (no arithmetic)."""
    carried = {name}
    for n in g.nodes:
        if n.op in (Op.copy, Op.cast, Op.slice, Op.flatten, Op.repeat) and n.inputs and n.inputs[0] in carried:
            carried.add(n.name)
    return next((o.field for o in g.outputs if o.value in carried), None)


@rule("buffer-capacity")
def _capacity(g: Graph, f: Facts) -> Iterator[Violation]:
    types, ranges = g.types(), value_ranges(g, f.roles)
    for n in g.nodes:
        lo, hi = ranges.get(n.name, (None, None))
        if n.type.dtype.value == "i32" and ((hi is not None and hi > 2**31 - 1) or (lo is not None and lo < -2**31)):
            yield Violation("buffer-capacity", n.name, n.origin,
                            f"int32 {n.op.value} can reach {hi if hi is not None and hi > 2**31 - 1 else lo} at bs="
                            f"{g.env.get('bs')} with max_context_len={g.env.get('L')}: past int32, it would wrap",
                            "compute it as int64 (cast first), or lower max_bs * max_context_len")
        if n.op is Op.page_table:
            P, W = int(n.a["page_size"]), concrete(n.a["width"])
            cols, top = concrete(types[n.inputs[0]].shape[1]), ranges.get(n.inputs[2], (None, None))[1]
            need = -(-cols // P) if cols is not None else None
            if W is not None and need is not None and W < need and (top is None or top > W * P):
                yield Violation("buffer-capacity", n.name, n.origin,
                                f"page table of width {W} holds {W * P} tokens per row, but a row can hold "
                                f"{top if top is not None else cols} (L={cols}): the last pages are dropped",
                                f"width=ceil(L/P) = {need} (W), not floor(L/P)")
        if n.op is not Op.ragged_gather:
            continue
        table, rows = types[n.inputs[0]], types[n.inputs[1]]
        cap, need = concrete(n.a["capacity"]), None
        r, w = concrete(rows.shape[0]), concrete(table.shape[1])
        top = ranges.get(n.inputs[2], (None, None))[1]  # a row's most entries: its length's bound (a window's)
        if w is not None and top is not None:
            w = min(w, top)
        if r is not None and w is not None:
            need = r * w
        if cap is not None and need is not None and cap < need:
            yield Violation("buffer-capacity", n.name, n.origin,
                            f"capacity {cap} is smaller than the {need} entries {r} rows of up to {w} tokens can need",
                            "size the buffer for the largest batch: capacity=max_bs*L (include every K, S, D factor)")


def _depends_on_batch(g: Graph) -> set[str]:
    """Values computed from per-step batch data (nodes come in program order: one forward sweep)."""
    out = {i.name for i in g.inputs if i.role is Role.batch}
    for n in g.nodes:
        if any(x in out for x in n.inputs):
            out.add(n.name)
    return out


@rule("unstable-buffer")
def _unstable(g: Graph, f: Facts) -> Iterator[Violation]:
    users = g.users()
    fields = {o.value: o.field for o in g.outputs}
    consts = set(g.constants())
    for n in g.region_nodes(Region.out_graph):
        if n.type.placement.on_host or n.name in consts:  # constants are made once, into static buffers
            continue
        read_in_graph = any(u.region is Region.in_graph for u in users.get(n.name, []))
        if n.movable:
            yield Violation("unstable-buffer", n.name, n.origin,
                            f"movable {n.op.value} was left in out_graph, so it would not be recorded: its result "
                            "is made anew every step while the graph reads the capture-time one",
                            "keep hoist-upgrades enabled, and make its inputs device values (not host mirrors) so "
                            "it can be recorded")
        elif n.name in fields:
            yield Violation("unstable-buffer", n.name, n.origin,
                            f"metadata field {fields[n.name]} is a device tensor out_graph makes anew every step; "
                            "the captured kernel keeps reading the one it saw at capture",
                            "compute it in in_graph so it is written in place into a static buffer "
                            "(or declare the step movable and let hoist-upgrades record it)")
        elif read_in_graph and n.type.is_dynamic:
            yield Violation("unstable-buffer", n.name, n.origin,
                            f"{n.op.value} result {n.type} crosses into the graph but has a data-dependent size, "
                            "so no static buffer can hold it",
                            "give it a static capacity so it is copied into a fixed buffer, or compute it in_graph")


@rule("frozen-host-scalar")
def _frozen_scalar(g: Graph, f: Facts) -> Iterator[Violation]:
    dyn = _depends_on_batch(g)
    fields = {o.value: o.field for o in g.outputs}
    for n in g.region_nodes(Region.in_graph):
        scalars = [x for x in n.inputs if x in f.scalars and x in dyn]
        if scalars:
            yield Violation("frozen-host-scalar", n.name, n.origin,
                            f"in_graph {n.op.value} takes per-step host number(s) "
                            f"{', '.join('%' + x for x in scalars)}; capture bakes in the value it had then",
                            "use a static bound (e.g. L or max_bs*L) or a per-mode constant, or compute the number "
                            "on device")
    for value, field in fields.items():
        if value in dyn and value in f.scalars:
            n = g.producers().get(value)
            yield Violation("frozen-host-scalar", value, n.origin if n else "",
                            f"metadata field {field} is a per-step host number; a captured kernel launch freezes "
                            "it at its capture-time value",
                            "pass a static bound (e.g. max_seq_len = L) or make the value part of the graph key")


@rule("planner-not-replayed")
def _planner(g: Graph, f: Facts) -> Iterator[Violation]:
    for n in g.region_nodes(Region.in_graph):
        if n.op is Op.host_call:
            yield Violation("planner-not-replayed", n.name, n.origin,
                            f"planner {n.a['target']!r} is in in_graph: host work inside capture is not recorded, "
                            "so replay reuses the capture-time plan",
                            "declare the planner in out_graph, where it runs before every replay")


@rule("capture-dependent-split")
def _split(g: Graph, f: Facts) -> Iterator[Violation]:
    users = g.users()
    fields = {o.value for o in g.outputs}
    for n in g.nodes:
        if n.op is not Op.split_at:
            continue
        graph_reads = n.region is Region.in_graph or n.name in fields or any(
            u.region is Region.in_graph for u in users.get(n.name, []))
        if graph_reads:
            yield Violation("capture-dependent-split", n.name, n.origin,
                            "a partition taken at a per-step index reaches the graph: replay keeps the split "
                            "computed from the capture batch",
                            "derive the split from (mode, bs) at compile time (static slice), or compute it on "
                            "device with static extents")


def find_violations(g: Graph, generic: Graph | None = None) -> list[Violation]:
    facts = Facts.of(g, generic)
    return [v for fn in RULES.values() for v in fn(g, facts)]


def check_split_graph(g: Graph, generic: Graph | None = None) -> Graph:
    """Raise SplitError with every violation in ``g``; return ``g`` if clean. ``generic``: the
    mode-generic graph ``g`` was specialized from, for facts no single size shows."""
    vs = find_violations(g, generic)
    if vs:
        raise SplitError(g.name, vs)
    return g


@register_pass("check-split")
def check_split(g: Graph, ctx: PassContext) -> Graph:
    """Requires a specialized graph. Guarantees no check-split rule fires
    (raises SplitError listing every violation otherwise); returns ``g``."""
    return check_split_graph(g, ctx.generic)
