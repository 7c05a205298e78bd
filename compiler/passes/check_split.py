"""check-split: the rules that keep a spec's out_graph/in_graph split
correct under CUDA-graph capture and replay. Each rule has a stable id;
every violation names the node, its spec origin, the rule and a fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from ..ir import OPS, Graph, Op, Region, Role
from ..ir.types import concrete
from .registry import PassContext, register_pass


@attrs.frozen
class Violation:
    rule: str
    node: str
    origin: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = f" ({self.origin})" if self.origin else ""
        return f"[{self.rule}] %{self.node}{where}: {self.message}\n      fix: {self.fix}"


class SplitError(ValueError):
    """The spec's split is illegal; ``violations`` holds every problem found."""

    def __init__(self, graph: str, violations: list[Violation]):
        self.violations = violations
        body = "\n".join(f"  {v}" for v in violations)
        super().__init__(f"check-split rejected {graph!r} with {len(violations)} violation(s):\n{body}")


Rule = Callable[[Graph], Iterator[Violation]]
RULES: dict[str, Rule] = {}


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        RULES[rule_id] = fn
        return fn

    return deco


@rule("dynamic-shape-in-graph")
def _dynamic(g: Graph) -> Iterator[Violation]:
    for n in g.region_nodes(Region.in_graph):
        if n.type.is_dynamic:
            yield Violation("dynamic-shape-in-graph", n.name, n.origin,
                            f"{n.op.value} produces {n.type}, whose extent depends on data; a captured graph "
                            "replays fixed shapes",
                            "size it by a static bound (e.g. capacity=max_bs*L) and guard rows on device, "
                            "or move the step to out_graph")


@rule("host-value-in-graph")
def _host_value(g: Graph) -> Iterator[Violation]:
    types = g.types()
    for n in g.region_nodes(Region.in_graph):
        host_ins = [x for x in n.inputs if types[x].placement.on_host]
        if host_ins:
            yield Violation("host-value-in-graph", n.name, n.origin,
                            f"in_graph {n.op.value} reads host value(s) "
                            f"{', '.join('%' + x for x in host_ins)}; replay would not see new host data",
                            "read the device tensor instead (seq_lens, not seq_lens_cpu), or copy the host "
                            "value into a static device buffer in out_graph")
        elif n.type.placement.on_host and n.op not in (Op.item, Op.to_host):
            yield Violation("host-value-in-graph", n.name, n.origin,
                            f"in_graph {n.op.value} writes a host tensor ({n.type})",
                            "produce a device tensor in in_graph, or move the step to out_graph")


@rule("unrecordable-op-in-graph")
def _unrecordable(g: Graph) -> Iterator[Violation]:
    for n in g.region_nodes(Region.in_graph):
        info = OPS[n.op]
        if not info.recordable:
            what = "synchronises device and host" if info.syncs else "cannot be captured"
            yield Violation("unrecordable-op-in-graph", n.name, n.origin,
                            f"{n.op.value} {what}; inside capture it raises or is frozen at its capture value",
                            "compute it in out_graph from a host mirror (e.g. seq_lens_cpu), "
                            "or replace it by a static-shape device op")


@rule("graph-to-host-edge")
def _graph_to_host(g: Graph) -> Iterator[Violation]:
    prod = g.producers()
    for n in g.region_nodes(Region.out_graph):
        from_graph = [x for x in n.inputs if x in prod and prod[x].region is Region.in_graph]
        if from_graph:
            yield Violation("graph-to-host-edge", n.name, n.origin,
                            f"out_graph {n.op.value} consumes in_graph result(s) "
                            f"{', '.join('%' + x for x in from_graph)}, which only exist after replay",
                            "compute the value in out_graph from host mirrors, or move this step into in_graph")


@rule("missing-fill-value")
def _missing_fill(g: Graph) -> Iterator[Violation]:
    for i in g.inputs:
        if i.role is Role.batch and i.fill is None:
            yield Violation("missing-fill-value", i.name, i.origin,
                            f"batch input {i.name} is padded to the captured batch size but declares no fill value",
                            "declare a safe fill, e.g. fill=1 for seq_lens, fill=0 for req_pool_indices "
                            "(slot 0 is reserved and all zero)")


@rule("buffer-capacity")
def _capacity(g: Graph) -> Iterator[Violation]:
    types = g.types()
    for n in g.nodes:
        if n.op is not Op.ragged_gather:
            continue
        table, rows = types[n.inputs[0]], types[n.inputs[1]]
        cap, need = concrete(n.a["capacity"]), None
        r, w = concrete(rows.shape[0]), concrete(table.shape[1])
        if r is not None and w is not None:
            need = r * w
        if cap is not None and need is not None and cap < need:
            yield Violation("buffer-capacity", n.name, n.origin,
                            f"capacity {cap} is smaller than the {need} entries {r} rows of up to {w} tokens can need",
                            "size the buffer for the largest batch: capacity=max_bs*L (include every K, S, D factor)")


def find_violations(g: Graph) -> list[Violation]:
    return [v for fn in RULES.values() for v in fn(g)]


def check_split_graph(g: Graph) -> Graph:
    """Raise SplitError with every violation in ``g``; return ``g`` if clean."""
    vs = find_violations(g)
    if vs:
        raise SplitError(g.name, vs)
    return g


@register_pass("check-split")
def check_split(g: Graph, ctx: PassContext) -> Graph:
    """Requires a specialized graph. Guarantees no check-split rule fires
    (raises SplitError listing every violation otherwise); returns ``g``."""
    return check_split_graph(g)
