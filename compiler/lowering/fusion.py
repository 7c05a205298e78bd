"""Triton source for a fused, row-parallel kernel (see passes/fuse.py).

One program per request row ``i``. A per-row value has a scalar form (its
value at row ``i``) and, when a prefix sum or a reduction needs the whole
batch, a vector form over ``offs = arange(BLOCK)``: each program recomputes
those cheap elementwise chains instead of exchanging data between programs.
The batch size is a runtime argument and ``BLOCK`` its next power of two,
so one source serves every captured size of a mode. A 2-D value ``[bs, M]``
(DeepSeek-V4's window and page indices) is, in program ``i``, its row: a
vector over the columns ``c<M> = arange(C<M>)``, masked to ``M``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile

import attrs

from ..ir import Graph, Op

_BIN = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})",
        "min": "tl.minimum({a}, {b})", "max": "tl.maximum({a}, {b})"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_TL = {"i32": "tl.int32", "i64": "tl.int64", "f32": "tl.float32", "bool": "tl.int1", "u8": "tl.uint8"}
_IDENT = {"sum": "0", "max": "-2147483648", "min": "2147483647"}
GATHER_BLOCK, PAGE_BLOCK = 128, 64


@attrs.frozen
class FusedKernel:
    source: str
    fn_name: str
    args: tuple[str, ...]  # values read through pointers, in signature order
    tables: tuple[str, ...]  # args that also pass (row stride, width, rows): 2-D tables, 1-D lookup tables
    row_arg: str  # an argument read per row: its length is the launch's row count
    outs: tuple[str, ...]  # values the kernel stores
    meta: tuple[tuple[str, int], ...]  # constexpr block sizes (BLOCK added at launch)


class _Emitter:
    def __init__(self, g: Graph, group: set[str]):
        self.g, self.group = g, group
        self.types, self.nodes = g.types(), g.producers()
        self.lines: list[str] = []
        self.args: list[str] = []
        self.tables: list[str] = []
        self.memo: dict[tuple[str, str], str] = {}
        self.meta: dict[str, int] = {}
        self.alias: dict[str, str] = {}
        self.row_args: list[str] = []

    def nm(self, x: str) -> str:
        """Positional name for value ``x`` in the source: equal programs get equal text."""
        return self.alias.setdefault(x, str(len(self.alias)))

    def arg(self, x: str) -> str:
        if x not in self.args:
            self.args.append(x)
        return f"p_{self.nm(x)}"

    def emit(self, name: str, expr: str) -> str:
        self.lines.append(f"    {name} = {expr}")
        return name

    # --- value forms ---
    def scalar(self, x: str) -> str:
        return self._form(x, "s")

    def vector(self, x: str) -> str:
        return self._form(x, "v")

    def columns(self, m: int) -> tuple[str, str]:
        """Column indices and their mask for a row of width ``m``."""
        if ("cols", m) not in self.memo:
            self.meta[f"C{m}"] = 1 << (m - 1).bit_length()
            self.memo[("cols", m)] = (self.emit(f"c{m}", f"tl.arange(0, C{m})"), self.emit(f"cm{m}", f"c{m} < {m}"))
        return self.memo[("cols", m)]

    def column(self, x: str, m: int) -> str:
        """A whole [m] argument (an ``outer`` operand), the same in every program."""
        if (x, "col") not in self.memo:
            c, cm = self.columns(m)
            self.memo[(x, "col")] = self.emit(f"k_{self.nm(x)}", f"tl.load({self.arg(x)} + {c}, mask={cm}, other=0)")
        return self.memo[(x, "col")]

    def _width(self, x: str) -> int | None:
        shape = self.types[x].shape
        return int(shape[1]) if len(shape) == 2 else None

    def _form(self, x: str, f: str) -> str:
        key = (x, f)
        if key not in self.memo:
            self.memo[key] = self._make(x, f)
        return self.memo[key]

    def _make(self, x: str, f: str) -> str:
        t = self.types[x]
        if x not in self.group:  # an argument: a per-row tensor or a device scalar
            p = self.arg(x)
            if t.shape == ():
                return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p})")
            if x not in self.row_args:
                self.row_args.append(x)
            if (w := self._width(x)) is not None:  # a per-row vector: this program's row of it
                c, cm = self.columns(w)
                return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p} + i * {w} + {c}, mask={cm}, other=0)")
            at = "i" if f == "s" else "offs, mask=m, other=0"
            return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p} + {at})")
        n = self.nodes[x]
        a, ins = n.a, n.inputs
        val = self.scalar if f == "s" else self.vector
        if n.op is Op.ewise and a["fn"] == "ceildiv":  # divisor positive by contract: exact either rounding
            u, d = val(ins[0]), val(ins[1])
            return self.emit(f"{f}_{self.nm(x)}", f"tl.where({u} >= 0, ({u} + {d} - 1) // {d}, -((-{u}) // {d}))")
        if n.op is Op.ewise:
            return self.emit(f"{f}_{self.nm(x)}", _BIN[a["fn"]].format(a=val(ins[0]), b=val(ins[1])))
        if n.op is Op.ewise_const:
            v, c = val(ins[0]), a["value"]
            if a["fn"] == "floordiv":  # exact floor for c > 0 whatever the back end's rounding
                floor = f"tl.where({v} >= 0, {v} // {c}, -((-{v} + {c - 1}) // {c}))"
                return self.emit(f"{f}_{self.nm(x)}", floor)
            if a["fn"] == "mod":  # floor modulo through the exact floor division above
                fl = f"tl.where({v} >= 0, {v} // {c}, -((-{v} + {c - 1}) // {c}))"
                return self.emit(f"{f}_{self.nm(x)}", f"({v} - ({fl}) * {c})")
            if a["fn"] == "ceildiv":
                return self.emit(f"{f}_{self.nm(x)}", f"tl.where({v} >= 0, ({v} + {c - 1}) // {c}, -((-{v}) // {c}))")
            return self.emit(f"{f}_{self.nm(x)}", _BIN[a["fn"]].format(a=v, b=c))
        if n.op is Op.cast:
            return self.emit(f"{f}_{self.nm(x)}", f"{val(ins[0])}.to({_TL[a['dtype'].value]})")
        if n.op is Op.compare:
            return self.emit(f"{f}_{self.nm(x)}", f"({val(ins[0])} {_CMP[a['fn']]} {val(ins[1])})")
        if n.op is Op.where:
            return self.emit(f"{f}_{self.nm(x)}", f"tl.where({val(ins[0])}, {val(ins[1])}, {val(ins[2])})")
        if n.op is Op.copy:
            return val(ins[0])
        if n.op is Op.lookup:  # an index outside the table reads entry 0 (the reserved slot)
            p, _, n_tab = self._table(ins[0])
            idx, w = val(ins[1]), self._width(x)
            safe = self.emit(f"ix_{self.nm(x)}", f"tl.where(({idx} >= 0) & ({idx} < {n_tab}), {idx}, 0)")
            mask = ", mask=m, other=0" if f != "s" else "" if w is None else f", mask={self.columns(w)[1]}, other=0"
            return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p} + {safe}{mask})")
        if n.op is Op.outer:  # this row's scalar against the whole column operand
            a, b = val(ins[0]), self.column(ins[1], self._width(x))
            fn = n.a["fn"]
            expr = f"({a} {_CMP[fn]} {b})" if fn in _CMP else _BIN[fn].format(a=a, b=b)
            return self.emit(f"{f}_{self.nm(x)}", expr)
        if n.op is Op.gather_rows:  # table[rows[i], cols[i, :]], -1 outside the row
            tp, stride, width = self._table(ins[0])
            row, cols, cm = self._row(ins[0], val(ins[1])), val(ins[2]), self.columns(self._width(x))[1]
            ok = self.emit(f"ok_{self.nm(x)}", f"({cols} >= 0) & ({cols} < {width})")
            got = self.emit(f"g_{self.nm(x)}", f"tl.load({tp} + {row} * {stride} + {cols}, mask={ok} & {cm}, other=0)")
            return self.emit(f"{f}_{self.nm(x)}", f"tl.where({ok}, {got}, -1)")
        if n.op is Op.flatten:  # stored row-major: program i writes its row
            return val(ins[0])
        if n.op is Op.reduce:
            r = f"tl.{a['fn']}(tl.where(m, {self.vector(ins[0])}, {_IDENT[a['fn']]}), axis=0)"
            return self.emit(f"r_{self.nm(x)}", r)
        if n.op is Op.cumsum and f == "s":
            before = f"tl.sum(tl.where(offs < i, {self.vector(ins[0])}, 0), axis=0)"
            excl = self.emit(f"e_{self.nm(x)}", before)
            inc = self.emit(f"s_{self.nm(x)}", f"{excl} + {self.scalar(ins[0])}")
            return excl if a["leading_zero"] else inc
        if n.op is Op.cumsum:
            return self.emit(f"v_{self.nm(x)}", f"tl.cumsum({self.vector(ins[0])}, axis=0)")
        raise NotImplementedError(f"no {f} form for {n.op.value}")

    # --- stores ---
    def store(self, x: str) -> None:
        n, p = self.nodes[x], f"o_{self.nm(x)}"
        if n.op is Op.cumsum and n.a["leading_zero"]:
            excl = self.scalar(x)
            self.lines.append(f"    tl.store({p} + i + 1, {excl} + {self.scalar(n.inputs[0])})")
            self.lines.append(f"    if i == 0:\n        tl.store({p}, 0)")
        elif n.op is Op.reduce:
            self.lines.append(f"    if i == 0:\n        tl.store({p}, {self.scalar(x)})")
        elif n.op is Op.ragged_gather:
            self._gather(n, p)
        elif n.op is Op.page_table:
            self._page_table(n, p)
        elif n.op is Op.repeat:
            times = int(n.a["times"])
            self.meta["TP2"] = max(1, 1 << (times - 1).bit_length())
            self.lines.append(f"    t_{self.nm(x)} = tl.arange(0, TP2)")
            t = f"t_{self.nm(x)}"
            self.lines.append(f"    tl.store({p} + i * {times} + {t}, {self.scalar(n.inputs[0])} + {t} * 0, "
                              f"mask={t} < {times})")
        elif (w := self._width(x) or (self._width(n.inputs[0]) if n.op is Op.flatten else None)) is not None:
            c, cm = self.columns(w)
            self.lines.append(f"    tl.store({p} + i * {w} + {c}, {self.scalar(x)}, mask={cm})")
        elif n.type.shape == ():  # a batch-wide scalar: every program has it, one stores it
            self.lines.append(f"    if i == 0:\n        tl.store({p}, {self.scalar(x)})")
        else:
            self.lines.append(f"    tl.store({p} + i, {self.scalar(x)})")

    def _table(self, x: str) -> tuple[str, str, str]:
        """A table's pointer, row stride and width (a 1-D table: its length as the width)."""
        p = self.arg(x)
        if x not in self.tables:
            self.tables.append(x)
        if len(self.types[x].shape) == 1:
            return p, "1", f"width_{self.nm(x)}"
        return p, f"stride_{self.nm(x)}", f"width_{self.nm(x)}"

    def _row(self, table: str, row: str) -> str:
        """A row index guarded on device: one outside the table reads row 0 (reserved, like padding)."""
        r = self.emit(f"rw_{len(self.lines)}", f"{row}.to(tl.int64)")
        return self.emit(f"rg_{len(self.lines)}", f"tl.where(({r} >= 0) & ({r} < nrows_{self.nm(table)}), {r}, 0)")

    def _gather(self, n, p: str) -> None:
        table, rows, lens, indptr, *jump = n.inputs
        tp, stride, width = self._table(table)
        x = self.nm(n.name)
        if indptr in self.group:
            start = self.scalar(indptr)
        else:
            start = self.emit(f"st_{x}", f"tl.load({self.arg(indptr)} + i)")
        cols = "o"
        if jump:  # a branch's draft slots: entries from split on read shift columns further
            split, shift = (self.scalar(v) for v in jump)
            cols = f"(o + tl.where(o >= {split}, {shift}, 0))"
        self.meta["GBLOCK"] = GATHER_BLOCK
        cap = int(n.type.shape[0])
        row = self._row(table, self.scalar(rows))
        self.lines += [
            f"    n_{x} = {self.scalar(lens)}",
            f"    at_{x} = {start}.to(tl.int64)",
            f"    for j in range(0, n_{x}, GBLOCK):",
            "        o = j + tl.arange(0, GBLOCK)",
            f"        c = {cols}",
            f"        w = (o < n_{x}) & (at_{x} + o >= 0) & (at_{x} + o < {cap})",  # never outside the output
            f"        v = tl.load({tp} + {row} * {stride} + c, mask=w & (c >= 0) & (c < {width}), other=0)",
            f"        tl.store({p} + at_{x} + o, v, mask=w)",
        ]

    def _page_table(self, n, p: str) -> None:
        table, rows, lens = n.inputs
        tp, stride, width = self._table(table)
        P, W, x = int(n.a["page_size"]), int(n.a["width"]), n.name
        self.meta["PBLOCK"] = PAGE_BLOCK
        self.lines += [
            f"    row_{self.nm(x)} = {self._row(table, self.scalar(rows))}",
            f"    np_{self.nm(x)} = tl.minimum(tl.minimum(({self.scalar(lens)} + {P - 1}) // {P}, {W}), "
            f"({width} + {P - 1}) // {P})",
            f"    for c in range(0, {W}, PBLOCK):",
            "        cols = c + tl.arange(0, PBLOCK)",
            f"        ok = cols < np_{self.nm(x)}",
            f"        pg = tl.load({tp} + row_{self.nm(x)} * {stride} + cols * {P}, mask=ok, other=0)",
            f"        pg = pg // {P}",
            f"        tl.store({p} + i * {W} + cols, tl.where(ok, pg, 0), mask=cols < {W})",
        ]


def generate(g: Graph, group: list[str], outs: list[str]) -> FusedKernel:
    """Source for one kernel computing ``group``; it stores ``outs``. The row count is a launch argument."""
    e = _Emitter(g, set(group))
    for x in outs:
        e.store(x)
    body = "\n".join(e.lines)
    sig = ([f"p_{e.nm(a)}" for a in e.args] + [f"stride_{e.nm(t)}, width_{e.nm(t)}, nrows_{e.nm(t)}"
                                                for t in e.tables]
           + [f"o_{e.nm(x)}" for x in outs])
    meta = sorted(e.meta.items())
    consts = ", ".join(["BLOCK: tl.constexpr", *(f"{k}: tl.constexpr" for k, _ in meta)])
    head = ("    i = tl.program_id(0)\n    offs = tl.arange(0, BLOCK)\n    m = offs < n_rows\n")
    text = f"def KERNEL({', '.join(sig)}, n_rows, {consts}):\n{head}{body}\n"
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    fn = f"fused_{digest}"
    src = ("# generated by attnmeta fuse: one program per request row\n"
           "import triton\nimport triton.language as tl\n\n\n@triton.jit\n" + text.replace("KERNEL", fn, 1))
    return FusedKernel(src, fn, tuple(e.args), tuple(e.tables), e.row_args[0], tuple(outs), tuple(meta))


_LOADED: dict[str, object] = {}


def load(k: FusedKernel):
    """Import the kernel from a file (Triton reads a jitted function's source from disk)."""
    if k.fn_name in _LOADED:
        return _LOADED[k.fn_name]
    from . import triton_kernels  # noqa: F401  (sets TRITON_INTERPRET on CPU-only hosts first)

    d = os.environ.get("ATTNMETA_KERNEL_DIR") or os.path.join(tempfile.gettempdir(), "attnmeta-kernels")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{k.fn_name}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(k.source)
        os.replace(tmp, path)  # atomic: concurrent compiles never import half a file
    spec = importlib.util.spec_from_file_location(k.fn_name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _LOADED[k.fn_name] = getattr(mod, k.fn_name)
    return _LOADED[k.fn_name]
