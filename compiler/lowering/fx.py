"""Lower a specialized graph to two torch.fx GraphModules.

- ``out_gm``: the out_graph nodes (host ops, planner calls), run before
  every replay.
- ``in_gm``: the in_graph nodes, captured once and replayed; each metadata
  output is written *in place* into a static buffer passed as ``out__<field>``.

Constant nodes (full, arange) are not lowered into either module: the runtime
evaluates them once into static buffers at instantiate, so they cost nothing
per step.
"""

from __future__ import annotations

import operator
import re

import attrs
import networkx as nx
import sympy
import torch
import torch.fx as fx

from ..ir import Graph, Node, Op, Region
from ..ir.ops import CONST_OPS
from ..ir.types import DType, Placement
from .kernels import KERNELS

DEVICE, PLANNERS = "device", "planners"


def out_arg(field: str) -> str:
    return f"out__{field}"


def scratch_arg(value: str) -> str:
    """Placeholder of the static device buffer a fused kernel stores an intermediate value into."""
    return f"tmp__{value}"


def host_arg(value: str) -> str:
    """Placeholder of the static host buffer an out_graph value is written into."""
    return f"hbuf__{value}"


@attrs.frozen
class LoweredPlan:
    graph: Graph
    consts: tuple[str, ...]
    out_gm: fx.GraphModule
    out_args: tuple[str, ...]  # placeholder order: value names, hbuf__<value>, DEVICE, PLANNERS
    out_results: tuple[str, ...]
    in_gm: fx.GraphModule
    in_args: tuple[str, ...]  # value names, out__<field>, DEVICE
    crossing: tuple[str, ...]  # out_graph device values the graph reads: need static buffers
    in_outputs: tuple[str, ...]  # fields written by in_gm
    kernels: tuple = ()  # FusedKernel sources launched by in_gm
    views: tuple[tuple[str, str, int, int], ...] = ()  # (value, input, start, stop): bound once, never run
    scratch: tuple[str, ...] = ()  # kernel-stored values that are no field: static buffers, tmp__<value>

    def code(self) -> str:
        text = (f"# out_graph of {self.graph.name}\n{self.out_gm.code}\n"
                f"# in_graph of {self.graph.name}\n{self.in_gm.code}")
        return text + "".join(f"\n# fused kernel\n{k.source}" for k in self.kernels)


def kernel_kwargs(n: Node) -> dict:
    """Attributes as the kernel functions take them (ints, torch dtypes)."""
    kw = {}
    for k, v in n.attrs:
        if isinstance(v, DType):
            v = v.torch
        elif isinstance(v, Placement):
            continue
        elif isinstance(v, tuple):
            v = [int(d) for d in v]
        elif isinstance(v, sympy.Expr):
            v = int(v)
        kw[k] = v
    return kw


def eval_const(n: Node, device: torch.device, ins=(), out: torch.Tensor | None = None) -> torch.Tensor:
    """A constant's value (``Graph.constants``): a const op on ``device``, or an op over the
    constants ``ins`` it reads."""
    if n.op not in CONST_OPS:
        return KERNELS[n.op](*ins, **kernel_kwargs(n), out=out)
    dev = torch.device("cpu") if n.type.placement.on_host else device
    return KERNELS[n.op](**kernel_kwargs(n), device=dev, out=out)


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name)


class _Builder:
    def __init__(self) -> None:
        self.g = fx.Graph()
        self.args: list[str] = []
        self.env: dict[str, fx.Node] = {}

    def arg(self, name: str) -> fx.Node:
        if name not in self.env:
            self.args.append(name)
            self.env[name] = self.g.placeholder(_ident(name))
        return self.env[name]

    def call(self, n: Node, out: fx.Node | None = None) -> fx.Node:
        ins = [self.env[x] if x in self.env else self.arg(x) for x in n.inputs]
        kw = kernel_kwargs(n)
        if n.op is Op.host_call:
            r = self.g.call_function(KERNELS[Op.host_call], (self.arg(PLANNERS), kw["target"], *ins), {"key": n.name})
        elif n.op is Op.to_device:
            r = self.g.call_function(KERNELS[n.op], tuple(ins), {"device": self.arg(DEVICE), "out": out})
        else:
            r = self.g.call_function(KERNELS[n.op], tuple(ins), {**kw, **({"out": out} if out is not None else {})})
        r.name = _ident(n.name)
        self.env[n.name] = r
        return r

    def module(self, results: list[fx.Node]) -> fx.GraphModule:
        self.g.output(tuple(results))
        # Plans of different batch sizes mostly lower to the same program (shapes live in the bound
        # buffers, not the code): share one module per distinct program, so compiling 256 sizes
        # generates a handful of modules, not 512.
        key = tuple((n.op, n.target, n.name, fx.node.map_arg((n.args, n.kwargs), lambda a: a.name))
                    for n in self.g.nodes)
        gm = _MODULES.get(key)
        if gm is None:
            gm = _MODULES[key] = fx.GraphModule(torch.nn.Module(), self.g)
        return gm


_MODULES: dict[tuple, fx.GraphModule] = {}
_LAUNCHERS: dict[tuple, object] = {}


def _launcher(g: Graph, group: list[str], outs: list[str]):
    """The fx target for one fused kernel: launches it on its arguments and the buffers it stores
    into (given after the arguments), and returns those buffers."""
    from .fusion import generate, load

    fk = generate(g, group, outs)
    tables = tuple(fk.args.index(t) for t in fk.tables)
    # the batch size is read off a per-row argument at launch, so sizes share one launcher
    row = fk.args.index(fk.row_arg)
    key = (fk.source, tables, row)
    if key not in _LAUNCHERS:
        _LAUNCHERS[key] = _make_launcher(load(fk), dict(fk.meta), len(fk.args), tables, row, fk.fn_name)
    return fk, _LAUNCHERS[key]


def _make_launcher(fn, meta, n_args, tables, row, name):
    from .launch import launch

    def run(*xs):
        ins, res = xs[:n_args], xs[n_args:]
        bs = ins[row].shape[0]
        strides = [v for k in tables for v in (ins[k].stride(0), ins[k].shape[1])]
        block = 1 << (bs - 1).bit_length()
        launch(lambda: fn[(bs,)](*ins, *strides, *res, bs, BLOCK=block, **meta))
        return res

    run.__name__ = name
    return run


def lower(g: Graph) -> LoweredPlan:
    """Requires a specialized, split-checked graph. Produces a LoweredPlan."""
    consts = g.constants()
    # A static row range of a batch input (a TBO child's rows) is a view of a static buffer: taken
    # once when the plan is bound. The code then holds no batch-size-dependent bounds, so every
    # size shares one module, and no step spends a call (or, on the host, a copy) on it.
    fields = {o.value for o in g.outputs}
    views = tuple((n.name, n.inputs[0], int(n.a["start"]), int(n.a["stop"])) for n in g.nodes
                  if n.op is Op.slice and n.inputs[0] in {i.name for i in g.inputs} and n.name not in fields)
    const_set = set(consts) | {v[0] for v in views}
    in_nodes = [n for n in g.nodes if n.region is Region.in_graph and n.name not in const_set]
    out_nodes = [n for n in g.nodes if n.region is Region.out_graph and n.name not in const_set]
    out_names = {n.name for n in out_nodes}
    in_names = {n.name for n in in_nodes}

    crossing = tuple(dict.fromkeys(x for n in in_nodes for x in n.inputs if x in out_names))
    out_fields_from_out = [o.value for o in g.outputs if o.value in out_names]
    ob = _Builder()
    for n in out_nodes:  # host tensors land in static host buffers: no allocation per step
        static = n.type.placement.on_host and n.type.dtype.value != "opaque" and not n.type.is_dynamic
        ob.call(n, out=ob.arg(host_arg(n.name)) if static and n.op is not Op.host_call else None)
    out_results = tuple(dict.fromkeys([*crossing, *out_fields_from_out]))
    out_gm = ob.module([ob.env[x] for x in out_results])

    ib = _Builder()
    bound: dict[str, str] = {}  # value -> first field whose buffer it is written into
    for o in g.outputs:
        if o.value in in_names and o.value not in bound:
            bound[o.value] = o.field
    users = g.users()
    fields = {o.value for o in g.outputs}
    kernels, scratch = [], []
    for item in _schedule(in_nodes):  # unfused nodes and whole kernels, in dependency order
        if isinstance(item, str):
            n = g.node(item)
            ib.call(n, out=ib.arg(out_arg(bound[n.name])) if n.name in bound else None)
            continue
        group = item
        outs = [x for x in group if x in fields or any(u.name not in group for u in users.get(x, []))]
        fk, run = _launcher(g, group, outs)
        kernels.append(fk)
        xs = [ib.env[a] if a in ib.env else ib.arg(a) for a in fk.args]
        # every store lands in a static buffer: a field's, or scratch for what another kernel reads,
        # so nothing is allocated per step and sizes share one launcher (and one module)
        xs += [ib.arg(out_arg(bound[x]) if x in bound else scratch_arg(x)) for x in outs]
        scratch += [x for x in outs if x not in bound]
        call = ib.g.call_function(run, tuple(xs))
        for k, x in enumerate(outs):
            ib.env[x] = ib.g.call_function(operator.getitem, (call, k))
    in_outputs = []
    for o in g.outputs:
        if o.value in out_names or o.value in const_set:
            continue  # out_graph fields are host values; const fields are filled at instantiate
        in_outputs.append(o.field)
        if bound.get(o.value) == o.field:
            continue
        # an input passed through, or a value bound to a second field: copy into this field's buffer
        src = ib.env[o.value] if o.value in ib.env else ib.arg(o.value)
        ib.g.call_method("copy_", (ib.arg(out_arg(o.field)), src))
    in_gm = ib.module([])
    return LoweredPlan(g, consts, out_gm, tuple(ob.args), out_results, in_gm, tuple(ib.args), crossing,
                       tuple(in_outputs), tuple(kernels), views, tuple(scratch))


def _schedule(in_nodes) -> list:
    """Topological order over unfused node names and fused groups (lists of names)."""
    kernel = {n.name: n.kernel for n in in_nodes if n.kernel}
    dag = nx.DiGraph()
    for n in in_nodes:
        me = kernel.get(n.name) or n.name
        dag.add_node(me)
        for x in n.inputs:
            src = kernel.get(x) or x
            if src in dag and src != me:
                dag.add_edge(src, me)
    members: dict[str, list[str]] = {}
    for n in in_nodes:
        if n.kernel:
            members.setdefault(n.kernel, []).append(n.name)
    first: dict[str, int] = {}  # ties broken by program order: a kernel sits where its first node was
    for i, n in enumerate(in_nodes):
        first.setdefault(kernel.get(n.name) or n.name, i)
    order = list(nx.lexicographical_topological_sort(dag, key=first.__getitem__))
    return [members.get(v, v) for v in order]
