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
import re
import tempfile

import attrs

from ..ir import Graph, Op
from .memo import Memo
from .places import LoweringError
from .rowemit import ROWEMIT

_VAR = re.compile(r"^\s+([a-z]+)_(\d+) = ")  # an emitted variable: <form>_<positional id> = ...


@attrs.frozen
class FusedKernel:
    source: str
    fn_name: str
    args: tuple[str, ...]  # values read through pointers, in signature order
    tables: tuple[str, ...]  # args that also pass (row stride, width, rows): 2-D tables, 1-D lookup tables
    row_arg: str  # an argument read per row: its length is the launch's row count
    outs: tuple[str, ...]  # values the kernel stores
    meta: tuple[tuple[str, int], ...]  # constexpr block sizes (BLOCK added at launch)
    values: tuple[str, ...] = ()  # the IR value behind each positional name: _<k> is values[k]
    notes: tuple[tuple[str, str], ...] = ()  # variables that are no IR value: what they are
    flat: bool = False  # elementwise only: each program takes BLOCK consecutive rows (launch_rows)

    def annotated(self, origins: dict[str, str]) -> str:
        """The source with every variable's IR value and spec line as a comment (for people: the
        compiled source stays positional, so equal programs share one compiled kernel)."""
        lines, notes = [], dict(self.notes)
        for line in self.source.splitlines():
            m = _VAR.match(line)
            k = m and m.group(2)
            if m and f"{m.group(1)}_{k}" in notes:
                line = f"{line}  # {notes[m.group(1) + '_' + k]}"
            elif k is not None and int(k) < len(self.values):
                v = self.values[int(k)]
                line = f"{line}  # %{v}" + (f" ({origins[v]})" if origins.get(v) else "")
            lines.append(line)
        return "\n".join(lines) + "\n"


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
        self.notes: dict[str, str] = {}
        self.row_args: list[str] = []
        self.flat = False  # rows are lanes: i is BLOCK row indices (a column of them if a row is a vector), masked

    def nm(self, x: str) -> str:
        """Positional name for value ``x`` in the source: equal programs get equal text."""
        return self.alias.setdefault(x, str(len(self.alias)))

    def arg(self, x: str) -> str:
        if x not in self.args:
            self.args.append(x)
        return f"p_{self.nm(x)}"

    def emit(self, name: str, expr: str, note: str = "") -> str:
        self.lines.append(f"    {name} = {expr}")
        if note:
            self.notes[name] = note
        return name

    # --- value forms (the row forms in lowering/rowemit.py call these) ---
    def name(self, n, f: str) -> str:
        return f"{f}_{self.nm(n.name)}"

    def val(self, x: str, f: str) -> str:
        """Value ``x`` at this program's row (``f="s"``) or over all rows (``"v"``), emitted once."""
        key = (x, f)
        if key not in self.memo:
            self.memo[key] = self._make(x, f)
        return self.memo[key]

    def scalar(self, x: str) -> str:
        return self.val(x, "s")

    def columns(self, m: int) -> tuple[str, str]:
        """Column indices and their mask for a row of width ``m``."""
        if ("cols", m) not in self.memo:
            self.meta[f"C{m}"] = 1 << (m - 1).bit_length()
            self.memo[("cols", m)] = (self.emit(f"c{m}", f"tl.arange(0, C{m})"), self.emit(f"cm{m}", f"c{m} < {m}"))
        return self.memo[("cols", m)]

    def vector_mask(self, cm: str) -> str:
        """A row vector's mask: its columns, and in a flat kernel its rows too (rows past the count)."""
        return f"m & {cm}" if self.flat else cm

    def column(self, x: str, m: int) -> str:
        """A whole [m] argument (an ``outer`` operand), the same in every program."""
        if (x, "col") not in self.memo:
            c, cm = self.columns(m)
            self.memo[(x, "col")] = self.emit(f"k_{self.nm(x)}", f"tl.load({self.arg(x)} + {c}, mask={cm}, other=0)")
        return self.memo[(x, "col")]

    def width(self, x: str) -> int | None:
        shape = self.types[x].shape
        return int(shape[1]) if len(shape) == 2 else None

    def table(self, x: str) -> tuple[str, str, str]:
        """A table's pointer, row stride and width (a 1-D table: its length as the width)."""
        p = self.arg(x)
        if x not in self.tables:
            self.tables.append(x)
        if len(self.types[x].shape) == 1:
            return p, "1", f"width_{self.nm(x)}"
        return p, f"stride_{self.nm(x)}", f"width_{self.nm(x)}"

    def row(self, table: str, row: str) -> str:
        """A row index guarded on device: one outside the table reads row 0 (reserved, like padding)."""
        r = self.emit(f"rw_{len(self.lines)}", f"{row}.to(tl.int64)", f"a row of %{table}")
        return self.emit(f"rg_{len(self.lines)}", f"tl.where(({r} >= 0) & ({r} < nrows_{self.nm(table)}), {r}, 0)",
                         f"the row of %{table}, guarded: outside the table reads row 0")

    def _make(self, x: str, f: str) -> str:
        t = self.types[x]
        if x not in self.group:  # an argument: a per-row tensor or a device scalar
            p = self.arg(x)
            if t.shape == ():
                return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p})")
            if x not in self.row_args:
                self.row_args.append(x)
            if (w := self.width(x)) is not None:  # a per-row vector: this program's row of it
                c, cm = self.columns(w)
                at = f"i * {w} + {c}, mask={self.vector_mask(cm)}, other=0"
                return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p} + {at})")
            at = "i, mask=m, other=0" if self.flat else "i" if f == "s" else "offs, mask=m, other=0"
            return self.emit(f"{f}_{self.nm(x)}", f"tl.load({p} + {at})")
        n = self.nodes[x]
        form = ROWEMIT[n.op]
        if form.emit is None:
            raise LoweringError(f"{n.op.value} %{x} is only stored by its kernel; nothing in it may read it")
        return form.emit(self, n, f)

    # --- stores ---
    def store(self, x: str) -> None:
        n, p = self.nodes[x], f"o_{self.nm(x)}"
        form = ROWEMIT[n.op]
        if form.store is not None and form.store(self, n, p):
            return
        if (w := self.width(x)) is not None:
            c, cm = self.columns(w)
            self.lines.append(f"    tl.store({p} + i * {w} + {c}, {self.scalar(x)}, mask={self.vector_mask(cm)})")
        elif n.type.shape == ():  # a batch-wide scalar: every program has it, one stores it
            self.lines.append(f"    if i == 0:\n        tl.store({p}, {self.scalar(x)})")
        else:
            self.lines.append(f"    tl.store({p} + i, {self.scalar(x)}{', mask=m' if self.flat else ''})")


# ops whose row form reads only its inputs at the same row: a group of them needs no program per row (a window's KV
# indices shifted into their pool run over thousands of slots, DSV4's compressed positions over every token: as many
# programs on a GPU, and as many Python calls in Triton's interpreter). ``outer`` pairs a row's value with a column
# argument that every program reads whole, so a row may be a vector of a few columns
FLAT_OPS = frozenset({Op.ewise, Op.ewise_const, Op.cast, Op.clamp, Op.log2_scale, Op.compare, Op.where, Op.copy,
                      Op.lookup, Op.outer})


def is_flat(g: Graph, group: list[str]) -> bool:
    """Whether ``group`` is elementwise over one row extent: every op in ``FLAT_OPS``, every value a row's scalar
    (1-D) or a row's vector of static width (2-D), a lookup's value a row's scalar (its table 1-D), and every
    argument it reads 1-D or 2-D (or a device scalar, the same for every row)."""
    types, nodes = g.types(), g.producers()
    inside = set(group)
    reads = {x for v in group for x in nodes[v].inputs if x not in inside}

    def row_value(v: str) -> bool:
        shape = types[v].shape
        return len(shape) == 1 or len(shape) == 2 and nodes[v].op is not Op.lookup and _static(shape[1])

    return all(nodes[v].op in FLAT_OPS and row_value(v) for v in group) and \
        all(len(types[x].shape) <= 2 for x in reads) and any(len(types[x].shape) >= 1 for x in reads)


def _static(d) -> bool:
    try:
        int(d)
    except TypeError:
        return False
    return True


def generate(g: Graph, group: list[str], outs: list[str]) -> FusedKernel:
    """Source for one kernel computing ``group``; it stores ``outs``. The row count is a launch argument. A flat
    group (``is_flat``) is written with BLOCK rows per program, masked past the row count."""
    e = _Emitter(g, set(group))
    e.flat = is_flat(g, group)
    for x in outs:
        e.store(x)
    body = "\n".join(e.lines)
    sig = ([f"p_{e.nm(a)}" for a in e.args] + [f"stride_{e.nm(t)}, width_{e.nm(t)}, nrows_{e.nm(t)}"
                                                for t in e.tables]
           + [f"o_{e.nm(x)}" for x in outs])
    meta = sorted(e.meta.items())
    consts = ", ".join(["BLOCK: tl.constexpr", *(f"{k}: tl.constexpr" for k, _ in meta)])
    prologue = (f"    i = (tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)){'[:, None]' if e.meta else ''}\n"
                "    m = i < n_rows\n" if e.flat else
                "    i = tl.program_id(0)\n    offs = tl.arange(0, BLOCK)\n    m = offs < n_rows\n")
    text = f"def KERNEL({', '.join(sig)}, n_rows, {consts}):\n{prologue}{body}\n"
    what = "BLOCK rows per program, elementwise" if e.flat else "one program per request row"
    head = (f"# generated by attnmeta fuse: {what} (jitted when loaded)\n"
            "import triton\nimport triton.language as tl\n\n\n")
    fn = f"fused_{hashlib.sha1((head + text).encode()).hexdigest()[:12]}"  # the file's name: all of its text
    src = head + text.replace("KERNEL", fn, 1)
    values = tuple(sorted(e.alias, key=lambda v: int(e.alias[v])))
    return FusedKernel(src, fn, tuple(e.args), tuple(e.tables), e.row_args[0], tuple(outs), tuple(meta), values,
                       tuple(sorted(e.notes.items())), e.flat)


_LOADED = Memo("loaded kernels", 4096)


def load(k: FusedKernel):
    """Import the kernel from a file (Triton reads a jitted function's source from disk)."""
    return _LOADED.get(k.fn_name, lambda: load_source(k.fn_name, k.source))


def module_file(name: str, source: str):
    """The module ``source``, written to ``<name>.py`` under the kernel directory (``ATTNMETA_KERNEL_DIR``, else the
    temp dir) and imported: generated code runs from a file a person can open (Triton also reads a jitted
    function's source from disk). A name is its text's hash where equal text may recur."""
    d = os.environ.get("ATTNMETA_KERNEL_DIR") or os.path.join(tempfile.gettempdir(), "attnmeta-kernels")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)  # atomic: concurrent compiles never import half a file
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_source(name: str, source: str, loose: tuple[str, ...] = ()):
    """Function ``name`` of ``source``, written to a file of that name and jitted; ``loose``: parameters Triton
    must not specialize on their values."""
    from .triton_kernels import jit

    fn = getattr(module_file(name, source), name)  # the source has no decorator: one place jits
    return jit(fn, do_not_specialize=list(loose)) if loose else jit(fn)
