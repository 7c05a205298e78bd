"""Shape rules and reference semantics of the indexing ops (slices, page
tables, lookups, repeats, row sorts). Assembled into the one op table in
ops.py; kept apart so each file stays readable."""

from __future__ import annotations

import attrs
import torch

from .errors import ShapeError
from .fns import CMP, EWISE
from .types import DType, Dynamic, TensorType


def _rank(t: TensorType, r: int, what: str) -> None:
    if len(t.shape) != r:
        raise ShapeError(f"{what} must be {r}-D, got {t}")


def infer_slice(ins, a):
    (x,) = ins
    if not x.shape:
        raise ShapeError(f"slice needs at least 1-D input, got {x}")
    start, stop, extent = a["start"], a["stop"], x.shape[0]
    for what, v in (("start", start), ("stop", stop), ("extent", stop - start)):
        if v.is_number and v < 0:  # known here, or once specialize-batch binds bs
            raise ShapeError(f"slice [{start}:{stop}] has a negative {what} ({v}) of a {x} value")
    if not isinstance(extent, Dynamic) and (stop - extent).is_number and stop - extent > 0:
        raise ShapeError(f"slice [{start}:{stop}] ends past its input's extent {extent}; slice within it")
    return attrs.evolve(x, shape=(stop - start, *x.shape[1:]))


def ref_slice(ins, a):
    return ins[0][int(a["start"]) : int(a["stop"])].clone()


def infer_split_at(ins, a):
    x, k = ins
    if k.shape != ():
        raise ShapeError(f"split_at index must be a scalar, got {k}")
    return attrs.evolve(x, shape=(Dynamic(f"split_at({x.shape[0]})"), *x.shape[1:]))


def ref_split_at(ins, a):
    return ins[0][: int(ins[1])].clone()


def infer_compare(ins, a):
    x, y = ins
    if a["fn"] not in CMP:
        raise ShapeError(f"compare fn must be one of {sorted(CMP)}, got {a['fn']!r}")
    if y.shape not in (x.shape, ()) or x.placement != y.placement:
        raise ShapeError(f"compare operands differ: {x} vs {y} (the second may be a scalar)")
    return attrs.evolve(x, dtype=DType.bool)


def ref_compare(ins, a):
    return CMP[a["fn"]](ins[0], ins[1])


def infer_where(ins, a):
    c, x, y = ins
    if c.dtype is not DType.bool or c.shape != x.shape:
        raise ShapeError(f"where condition must be bool of shape {x.shape}, got {c}")
    if y.shape not in (x.shape, ()) or y.dtype != x.dtype:
        raise ShapeError(f"where branches differ: {x} vs {y} (the second may be a scalar)")
    return x


def ref_where(ins, a):
    return torch.where(ins[0], ins[1], ins[2])


def integers(op: str, **operands) -> None:
    """Operands that index memory (rows, lengths, columns) must be integers: a float has no exact row, a bool
    no range."""
    for what, t in operands.items():
        if t.dtype not in (DType.int32, DType.int64):
            raise ShapeError(f"{op} {what} index memory and must be integers (DType.int32 or int64), got {t}; "
                             f"declare the input they come from with an integer dtype")


def infer_page_table(ins, a):
    table, rows, lens = ins
    _rank(table, 2, "page_table table")
    _rank(rows, 1, "page_table rows")
    _rank(lens, 1, "page_table lens")
    integers("page_table", rows=rows, lens=lens)
    if a["page_size"] < 1:
        raise ShapeError(f"page_table page_size must be >= 1 (tokens per page), got {a['page_size']}")
    return TensorType(DType.int32, (rows.shape[0], a["width"]), rows.placement)


def safe_rows(rows: torch.Tensor, n: int) -> torch.Tensor:
    """Row indices as kernels guard them: outside [0, n) reads row 0 (reserved)."""
    rows = rows.long()
    return torch.where((rows >= 0) & (rows < n), rows, 0)


def ref_page_table(ins, a):
    table, rows, lens = ins
    P, W = int(a["page_size"]), int(a["width"])
    out = torch.zeros(rows.shape[0], W, dtype=torch.int32)
    rows = safe_rows(rows, table.shape[0])
    for i in range(rows.shape[0]):
        n = max(min(-(-int(lens[i]) // P), W, -(-table.shape[1] // P)), 0)
        out[i, :n] = (table[int(rows[i]), 0 : n * P : P] // P).to(torch.int32)
    return out


def infer_repeat(ins, a):
    (x,) = ins
    _rank(x, 1, "repeat input")
    t = a["times"]
    if getattr(t, "is_Integer", False) and int(t) < 1 or getattr(t, "is_negative", False):
        raise ShapeError(f"repeat times must be >= 1 (each entry at least once), got {t}; an empty result "
                         "holds no metadata")
    return attrs.evolve(x, shape=(x.shape[0] * a["times"],))


def ref_repeat(ins, a):
    return torch.repeat_interleave(ins[0], int(a["times"]))


def infer_lookup(ins, a):
    table, idx = ins
    _rank(table, 1, "lookup table")
    if idx.dtype not in (DType.int32, DType.int64):
        raise ShapeError(f"lookup indices must be integers, got {idx}")
    return attrs.evolve(idx, dtype=table.dtype)


def ref_lookup(ins, a):
    return ins[0][safe_rows(ins[1], ins[0].shape[0])]


def infer_rows(ins, a):
    (x,) = ins
    _rank(x, 2, f"{a.get('fn', 'sort')} rows input")
    return x if "fn" not in a else attrs.evolve(x, shape=(x.shape[0],))


def ref_sort_rows(ins, a):
    return torch.sort(ins[0], dim=1).values


def ref_reduce_rows(ins, a):
    x = ins[0]
    fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[a["fn"]]
    return fn(x, dim=1).to(x.dtype) if x.shape[1] else torch.zeros(x.shape[0], dtype=x.dtype)


def _outer_fns():
    return {**EWISE, **CMP}


def infer_outer(ins, a):
    x, y = ins
    _rank(x, 1, "outer first operand")
    _rank(y, 1, "outer second operand")
    if a["fn"] not in _outer_fns():
        raise ShapeError(f"outer fn must be one of {sorted(_outer_fns())}, got {a['fn']!r}")
    if x.dtype != y.dtype or x.placement != y.placement:
        raise ShapeError(f"outer operands differ in dtype or placement: {x} vs {y}")
    dtype = DType.bool if a["fn"] in CMP else x.dtype
    return TensorType(dtype, (x.shape[0], y.shape[0]), x.placement)


def ref_outer(ins, a):
    x, y = ins
    r = _outer_fns()[a["fn"]](x[:, None], y[None, :])
    return r if a["fn"] in CMP else r.to(x.dtype)


def infer_gather_rows(ins, a):
    table, rows, cols = ins
    _rank(table, 2, "gather_rows table")
    _rank(rows, 1, "gather_rows rows")
    _rank(cols, 2, "gather_rows cols")
    integers("gather_rows", rows=rows, cols=cols)
    if cols.shape[0] != rows.shape[0]:
        raise ShapeError(f"gather_rows needs one column row per row: {rows} vs {cols}")
    return attrs.evolve(cols, dtype=table.dtype)


def ref_gather_rows(ins, a):
    table, rows, cols = ins
    ok = (cols >= 0) & (cols < table.shape[1])
    got = table[safe_rows(rows, table.shape[0])[:, None], cols.clamp(0, table.shape[1] - 1).long()]
    return torch.where(ok, got, torch.full_like(got, -1))


def infer_flatten(ins, a):
    (x,) = ins
    _rank(x, 2, "flatten input")
    return attrs.evolve(x, shape=(x.shape[0] * x.shape[1],))
