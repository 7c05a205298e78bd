"""The op table: one entry per op, the single source of truth for
shape rules, attribute schemas, recordability and reference semantics.

A reference implementation is plain torch on CPU tensors, written for
clarity, not speed: it is the oracle the interpreter runs and every pass and
lowering is compared against.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

import attrs
import sympy
import torch

from . import ops_guard as gd
from . import ops_index as ix
from .errors import ShapeError
from .fns import EWISE, REDUCE
from .types import DType, Dynamic, Placement, TensorType, dim


@attrs.frozen
class Binds:
    """What a planner (``host_call``) plans into: role -> the IR value of a metadata field. Values,
    not field names, so inlining (TBO children, MultiStep steps) renames them like inputs (and CSE
    never merges them: a planner may write what it binds);
    lowering turns each into the field's static buffer, handed to the planner as its site."""

    pairs: tuple[tuple[str, str], ...] = ()

    def values(self) -> tuple[str, ...]:
        return tuple(v for _, v in self.pairs)

    def rename(self, new) -> Binds:
        """``new(value) -> value``: the same roles on renamed values."""
        return Binds(tuple((r, new(v)) for r, v in self.pairs))


AttrValue = int | bool | str | sympy.Expr | Dynamic | DType | tuple | Binds
Attrs = dict[str, AttrValue]


class Op(enum.Enum):
    full = "full"
    arange = "arange"
    cumsum = "cumsum"
    cast = "cast"
    ewise = "ewise"
    ewise_const = "ewise_const"
    ragged_gather = "ragged_gather"
    reduce = "reduce"
    item = "item"
    to_host = "to_host"
    to_device = "to_device"
    nonzero = "nonzero"
    host_call = "host_call"
    slice = "slice"
    split_at = "split_at"
    compare = "compare"
    where = "where"
    page_table = "page_table"
    repeat = "repeat"
    lookup = "lookup"
    sort_rows = "sort_rows"
    reduce_rows = "reduce_rows"
    copy = "copy"
    outer = "outer"
    gather_rows = "gather_rows"
    flatten = "flatten"
    clamp = "clamp"
    log2_scale = "log2_scale"
    ingest = "ingest"


@attrs.frozen
class OpInfo:
    arity: int | None  # None: variadic
    attrs: dict[str, type | tuple[type, ...]]
    infer: Callable[[Sequence[TensorType], Attrs], TensorType]
    ref: Callable[[Sequence[torch.Tensor], Attrs], torch.Tensor | None]
    recordable: bool  # may run inside a captured CUDA graph
    syncs: bool = False  # device->host synchronisation
    doc: str = ""


_DIM = (sympy.Expr, Dynamic)



def _one_d(t: TensorType, what: str) -> None:
    if len(t.shape) != 1:
        raise ShapeError(f"{what} must be 1-D, got {t}")


def _infer_full(ins, a):
    return TensorType(a["dtype"], a["shape"], a["placement"])


def _ref_full(ins, a):
    shape = [int(d) for d in a["shape"]]
    return torch.full(shape, a["value"], dtype=a["dtype"].torch)


def _infer_arange(ins, a):
    return TensorType(a["dtype"], (a["n"],), a["placement"])


def _ref_arange(ins, a):
    n = int(a["n"])
    return torch.arange(n, dtype=torch.int64).mul(a["step"]).add(a["start"]).to(a["dtype"].torch)


def _infer_cumsum(ins, a):
    (x,) = ins
    _one_d(x, "cumsum input")
    n = x.shape[0]
    out = n if isinstance(n, Dynamic) else n + (1 if a["leading_zero"] else 0)
    return TensorType(x.dtype, (out,), x.placement)


def _ref_cumsum(ins, a):
    (x,) = ins
    c = torch.cumsum(x, 0, dtype=x.dtype)
    if a["leading_zero"]:
        c = torch.cat([torch.zeros(1, dtype=x.dtype), c])
    return c


def _infer_cast(ins, a):
    (x,) = ins
    return attrs.evolve(x, dtype=a["dtype"])


def _infer_ewise(ins, a):
    x, y = ins
    if a["fn"] not in EWISE:
        raise ShapeError(f"ewise fn must be one of {sorted(EWISE)}, got {a['fn']!r}")
    if y.shape not in (x.shape, ()):
        raise ShapeError(f"ewise operands differ in shape: {x} vs {y} (the second may be a scalar)")
    # a 0-d second operand may sit anywhere: check-split, not the type rule, rejects a host scalar in the graph
    if x.dtype != y.dtype or (x.placement != y.placement and y.shape != ()):
        raise ShapeError(f"ewise operands differ in dtype or placement: {x} vs {y}")
    return x


def _infer_ewise_const(ins, a):
    if a["fn"] not in EWISE:
        raise ShapeError(f"ewise_const fn must be one of {sorted(EWISE)}, got {a['fn']!r}")
    return ins[0]


def _ref_ewise_const(ins, a):
    (x,) = ins
    return EWISE[a["fn"]](x, torch.tensor(a["value"], dtype=x.dtype)).to(x.dtype)


def _infer_log2_scale(ins, a):
    (x,) = ins
    if x.dtype not in (DType.int32, DType.int64):
        raise ShapeError(f"log2_scale takes integers, got {x}")
    if a["divisor"] < 1 or a["scale"] < 0:
        raise ShapeError(f"log2_scale needs divisor >= 1 and scale >= 0, got {a['divisor']} and {a['scale']}")
    return attrs.evolve(x, dtype=DType.int32)


def _ref_log2_scale(ins, a):
    # float32 throughout, as the engines' Triton heuristic computes it; log2(0) = -inf, then 1
    f = torch.log2(ins[0].to(torch.float32) / a["divisor"])
    return (torch.clamp(f, min=1.0) * a["scale"]).to(torch.int32)


def _infer_ragged_gather(ins, a):
    if len(ins) not in (4, 6, 8):
        raise ShapeError(f"ragged_gather takes (table, rows, lens, indptr[, split, shift[, split2, shift2]]), got "
                         f"{len(ins)} inputs")
    table, rows, *per_row = ins
    if len(table.shape) != 2:
        raise ShapeError(f"ragged_gather table must be 2-D [rows, L], got {table}")
    ix.integers("ragged_gather", rows=rows, **{w: t for w, t in zip(("lens", "indptr", "split", "shift", "split2",
                                                                   "shift2"), per_row, strict=False)})
    for t, w in zip((rows, *per_row), ("rows", "lens", "indptr", "split", "shift", "split2", "shift2"), strict=False):
        _one_d(t, f"ragged_gather {w}")
    return TensorType(table.dtype, (a["capacity"],), rows.placement)


def gather_columns(n: int, *jumps: int) -> torch.Tensor:
    """Columns row entries j < n read: j, plus each (split, shift) pair's shift once j reaches its split (a
    window's first column with split 0; a branch's draft slots after its prefix)."""
    j = torch.arange(n)
    cols = j.clone()
    for split, shift in zip(jumps[::2], jumps[1::2], strict=True):
        cols += (j >= split).long() * shift
    return cols


def safe_row(r: int, n: int) -> int:
    """A row (or slot) index as every kernel guards it on device: one outside [0, n) reads entry 0,
    the reserved row or slot that padded rows use. No index can reach outside its table."""
    return r if 0 <= r < n else 0


def _ref_ragged_gather(ins, a):
    table, rows, lens, indptr, *jump = ins
    cap = int(a["capacity"])
    out = torch.zeros(cap, dtype=table.dtype)
    for i in range(rows.shape[0]):
        n, s, r = max(int(lens[i]), 0), int(indptr[i]), safe_row(int(rows[i]), table.shape[0])
        cols = gather_columns(n, *(int(x[i]) for x in jump))
        at = s + torch.arange(n)
        write = (at >= 0) & (at < cap)  # never outside the output buffer
        read = write & (cols >= 0) & (cols < table.shape[1])  # nor past the row: entries left 0
        out[at[write]] = 0
        out[at[read]] = table[r, cols[read]]
    return out


def _infer_clamp(ins, a):
    if a["lo"] > a["hi"]:
        raise ShapeError(f"clamp bounds are empty: lo={a['lo']} > hi={a['hi']}")
    return ins[0]


def _infer_reduce(ins, a):
    (x,) = ins
    if a["fn"] not in REDUCE:
        raise ShapeError(f"reduce fn must be one of {sorted(REDUCE)}, got {a['fn']!r}")
    return TensorType(x.dtype, (), x.placement)


def _ref_reduce(ins, a):
    (x,) = ins
    if x.numel() == 0:
        return torch.zeros((), dtype=x.dtype)
    return REDUCE[a["fn"]](x).to(x.dtype)


def _to(placement: Placement):
    def infer(ins, a):
        (x,) = ins
        return attrs.evolve(x, placement=placement)

    return infer


def _infer_nonzero(ins, a):
    (x,) = ins
    return TensorType(DType.int64, (Dynamic(f"nonzero({x.shape[0]})"),), x.placement)


def _infer_host_call(ins, a):
    return TensorType(DType.opaque, (), Placement.host)


OPS: dict[Op, OpInfo] = {
    Op.full: OpInfo(0, {"value": int, "shape": tuple, "dtype": DType, "placement": Placement},
                    _infer_full, _ref_full, True, doc="constant tensor"),
    Op.arange: OpInfo(0, {"start": int, "step": int, "n": _DIM, "dtype": DType, "placement": Placement},
                      _infer_arange, _ref_arange, True, doc="start + step*i, i < n"),
    Op.cumsum: OpInfo(1, {"leading_zero": bool}, _infer_cumsum, _ref_cumsum, True,
                      doc="inclusive prefix sum; leading_zero prepends 0 (an indptr)"),
    Op.cast: OpInfo(1, {"dtype": DType}, _infer_cast, lambda ins, a: ins[0].to(a["dtype"].torch), True),
    Op.ewise: OpInfo(2, {"fn": str}, _infer_ewise, lambda ins, a: EWISE[a["fn"]](*ins).to(ins[0].dtype), True),
    Op.ewise_const: OpInfo(1, {"fn": str, "value": int}, _infer_ewise_const, _ref_ewise_const, True),
    Op.ragged_gather: OpInfo(None, {"capacity": _DIM}, _infer_ragged_gather, _ref_ragged_gather, True,
                             doc="out[indptr[i] + j] = table[rows[i], c(j)] for j < lens[i], out sized capacity; "
                                 "c(j) = j, or with (split, shift) j + shift once j >= split[i]. Guarded: a row "
                                 "outside the table reads row 0, a column past it reads 0, nothing is written "
                                 "outside out"),
    Op.reduce: OpInfo(1, {"fn": str}, _infer_reduce, _ref_reduce, True),
    Op.item: OpInfo(1, {}, _to(Placement.host), lambda ins, a: ins[0].clone(), False, syncs=True,
                    doc="device scalar to a host number (blocks)"),
    Op.to_host: OpInfo(1, {}, _to(Placement.host), lambda ins, a: ins[0].clone(), False, syncs=True),
    Op.to_device: OpInfo(1, {}, _to(Placement.device), lambda ins, a: ins[0].clone(), False,
                         doc="host to device copy: an H2D inside capture is illegal"),
    Op.nonzero: OpInfo(1, {}, _infer_nonzero, lambda ins, a: torch.nonzero(ins[0]).flatten(), False, syncs=True),
    Op.host_call: OpInfo(None, {"target": str, "binds": Binds}, _infer_host_call, lambda ins, a: None, False,
                         doc="opaque host planner (e.g. FlashInfer plan) over host inputs, planning into the "
                             "fields of binds; runs out of graph"),
    Op.slice: OpInfo(1, {"start": _DIM, "stop": _DIM}, ix.infer_slice, ix.ref_slice, True,
                     doc="static row range x[start:stop] (slice-to-bs, TBO children)"),
    Op.split_at: OpInfo(2, {}, ix.infer_split_at, ix.ref_split_at, False,
                        doc="rows up to a per-step index: a data-dependent partition"),
    Op.compare: OpInfo(2, {"fn": str}, ix.infer_compare, ix.ref_compare, True),
    Op.where: OpInfo(3, {}, ix.infer_where, ix.ref_where, True),
    Op.page_table: OpInfo(3, {"page_size": int, "width": _DIM}, ix.infer_page_table, ix.ref_page_table, True,
                          doc="out[i, j] = table[rows[i], j*P] // P for pages j < ceil(lens[i]/P), else 0; a row "
                              "outside the table reads row 0"),
    Op.repeat: OpInfo(1, {"times": _DIM}, ix.infer_repeat, ix.ref_repeat, True, doc="repeat_interleave by a constant"),
    Op.lookup: OpInfo(2, {}, ix.infer_lookup, ix.ref_lookup, True,
                      doc="table[idx] (e.g. full->SWA slots); an index outside the table reads table[0]"),
    Op.sort_rows: OpInfo(1, {}, ix.infer_rows, ix.ref_sort_rows, True),
    Op.reduce_rows: OpInfo(1, {"fn": str}, ix.infer_rows, ix.ref_reduce_rows, True),
    Op.copy: OpInfo(1, {}, lambda ins, a: ins[0], lambda ins, a: ins[0].clone(), True, doc="bind-output copy"),
    Op.outer: OpInfo(2, {"fn": str}, ix.infer_outer, ix.ref_outer, True, doc="out[i, j] = fn(a[i], b[j])"),
    Op.flatten: OpInfo(1, {}, ix.infer_flatten, lambda ins, a: ins[0].reshape(-1).clone(), True,
                       doc="[n, m] -> [n*m], row-major (per-request rows to per-token values)"),
    Op.clamp: OpInfo(1, {"lo": int, "hi": int}, _infer_clamp, lambda ins, a: ins[0].clamp(a["lo"], a["hi"]), True,
                     doc="min(max(x, lo), hi): a value kept inside [lo, hi] (lengths, split counts)"),
    Op.log2_scale: OpInfo(1, {"scale": int, "divisor": int}, _infer_log2_scale, _ref_log2_scale, True,
                          doc="int32(scale * max(log2(x / divisor), 1)) in float32: split-KV heuristics' "
                              "SM-count term (x >= 0)"),
    Op.gather_rows: OpInfo(3, {}, ix.infer_gather_rows, ix.ref_gather_rows, True,
                           doc="out[i, j] = table[rows[i], cols[i, j]], -1 where cols is outside the row; a row "
                               "outside the table reads row 0"),
    Op.ingest: OpInfo(None, {"field": str, "code": int, "lo": int, "hi": _DIM, "hi_of": tuple, "engine_lo": int,
                             "clamp": bool, "per_row": int, "captured": tuple, "index": bool,
                             "sized": bool}, gd.infer_ingest, gd.ref_ingest, True,
                      doc="a device batch input as the kernels read it: staged, fed from the device or the engine's "
                          "own buffer (the word says), checked against [lo, hi], a bad value replaced and recorded "
                          "(ops_guard.py)"),
}


# Ops with no data inputs: evaluated once into static buffers when a plan is bound, never per step.
CONST_OPS = (Op.full, Op.arange)


def check_attrs(op: Op, a: Attrs) -> None:
    """Raise ShapeError if ``a`` does not match the op's attribute schema."""
    schema = OPS[op].attrs
    missing, extra = set(schema) - set(a), set(a) - set(schema)
    if missing or extra:
        raise ShapeError(f"{op.value}: attributes {sorted(a)} do not match schema {sorted(schema)}"
                         f" (missing {sorted(missing)}, unexpected {sorted(extra)})")
    for k, ty in schema.items():
        v = a[k]
        if isinstance(v, bool) and ty is int:
            raise ShapeError(f"{op.value}: attribute {k} must be int, got bool")
        if not isinstance(v, ty):
            raise ShapeError(f"{op.value}: attribute {k} must be {ty}, got {type(v).__name__} {v!r}")


def infer(op: Op, ins: Sequence[TensorType], a: Attrs) -> TensorType:
    info = OPS[op]
    if info.arity is not None and len(ins) != info.arity:
        raise ShapeError(f"{op.value} takes {info.arity} inputs, got {len(ins)}")
    check_attrs(op, a)
    return info.infer(ins, a)


def norm_attr(v: AttrValue) -> AttrValue:
    """Canonical form of an attribute value (dims as sympy, shapes as tuples of dims)."""
    if isinstance(v, tuple):
        return tuple(dim(x) for x in v)
    if isinstance(v, sympy.Basic):
        return dim(v)
    return v


def coerce_attrs(op: Op, a: Attrs) -> Attrs:
    """Builder convenience: dims given as ints or strings ("max_bs*L") become sympy dims."""
    schema = OPS[op].attrs
    out = {}
    for k, v in a.items():
        ty = schema.get(k)
        if ty == _DIM and isinstance(v, int | str) and not isinstance(v, bool):
            v = dim(v)
        elif ty is tuple and isinstance(v, list | tuple):
            v = tuple(dim(x) for x in v)
        out[k] = v
    return out
