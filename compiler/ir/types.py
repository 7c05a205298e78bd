"""Value types of the metadata IR: dtype, symbolic shape, placement.

A dim is a sympy expression over named symbols (``bs``, ``L``, ``max_bs`` ...),
an int being the constant case, or ``Dynamic``: a data-dependent extent such as
``sum(seq_lens)`` that no static buffer can be sized for.
"""

from __future__ import annotations

import enum
import functools
import re

import attrs
import sympy
import torch


class DType(enum.Enum):
    int32 = "i32"
    int64 = "i64"
    float32 = "f32"
    bool = "bool"
    uint8 = "u8"
    opaque = "opaque"  # planner handles: no tensor data

    @property
    def torch(self) -> torch.dtype:
        return _TORCH[self]

    @classmethod
    def of(cls, dtype: torch.dtype) -> DType:
        for k, v in _TORCH.items():
            if v == dtype:
                return k
        raise ValueError(f"unsupported torch dtype {dtype}")


_TORCH = {
    DType.int32: torch.int32,
    DType.int64: torch.int64,
    DType.float32: torch.float32,
    DType.bool: torch.bool,
    DType.uint8: torch.uint8,
}


class Placement(enum.Enum):
    host = "host"
    pinned = "pinned"
    device = "device"

    @property
    def on_host(self) -> bool:
        return self is not Placement.device


class Region(enum.Enum):
    out_graph = "out_graph"
    in_graph = "in_graph"


@attrs.frozen
class Dynamic:
    """A data-dependent extent; ``why`` says what it depends on."""

    why: str

    def __str__(self) -> str:
        return f"?{self.why}"


Dim = sympy.Expr | Dynamic

# Symbols the specs and options use. One table so the parser and the
# specializer agree on names.
# R: req pool rows and N: KV slots, both bound only when a pool is (instantiate); SW: the sliding window
SYMBOL_NAMES = ("bs", "max_bs", "R", "N", "L", "P", "W", "T", "D", "K", "S", "SW")
SYMBOLS = {n: sympy.Symbol(n, integer=True, nonnegative=True) for n in SYMBOL_NAMES}


def dim(x: int | str | sympy.Expr | Dynamic, names: bool = False) -> Dim:
    """Normalise an int, a symbol name, an expression or a Dynamic to a Dim; ``names``: other names may appear
    (a bound naming another input, ``"L - D + extend_seq_lens"``)."""
    if isinstance(x, Dynamic):
        return x
    if isinstance(x, bool):
        raise TypeError("a dim cannot be a bool")
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, str):
        return _parse_dim(x, names)
    if not isinstance(x, sympy.Expr):  # a float or None: no extent, and sympy would fail on it deep inside
        raise TypeError(f"{x!r} ({type(x).__name__}) is no extent; an extent is an int or an expression over "
                        "the symbols (e.g. 'bs + 1')")
    return x if x.is_Atom else _simplify(x)


def bind(d: Dim, env: dict[str, int]) -> Dim:
    """``d`` with the symbols ``env`` binds replaced by their values: an Integer when it binds them
    all. Specialization binds the same few expressions for every captured size, so each is turned
    once into a plain Python function (substituting through sympy costs ~100x more)."""
    if isinstance(d, Dynamic) or d.is_Integer:
        return d
    syms, fn = _evaluator(d)
    if all(s.name in env for s in syms):
        v = fn(*(env[s.name] for s in syms))
        if v == int(v):
            return sympy.Integer(int(v))
    return d.xreplace({SYMBOLS[k]: sympy.Integer(v) for k, v in env.items()})


@functools.lru_cache(maxsize=4096)
def _evaluator(d: sympy.Expr):
    syms = tuple(sorted(d.free_symbols, key=lambda s: s.name))
    return syms, sympy.lambdify(syms, d, modules="math")


@functools.lru_cache(maxsize=4096)
def _simplify(x: sympy.Expr) -> sympy.Expr:
    # expand: one canonical form for polynomial extents (2*(bs+1) == 2*bs + 2), floor and ceiling
    # kept as written; simplify finds no more in extents and costs ~30x (200 ms on its first call)
    return sympy.expand(x)


_NAME = re.compile(r"[A-Za-z_]\w*")
_FUNCS = {"ceiling", "floor", "Max", "Min", "max", "min", "ceil"}


@functools.lru_cache(maxsize=4096)
def _parse_dim(s: str, names: bool = False) -> sympy.Expr:
    unknown = sorted({n for n in _NAME.findall(s) if n not in SYMBOLS and n not in _FUNCS})
    if unknown and not names:
        raise ValueError(f"{s!r} names {', '.join(repr(n) for n in unknown)}, which is no symbol; an extent is an "
                         f"int or an expression over {', '.join(SYMBOL_NAMES)} (e.g. 'bs + 1', 'max_bs*L')")
    try:
        local = {n: sympy.Symbol(n, integer=True) for n in unknown}  # another input's name (a per-row bound)
        d = sympy.sympify(s, locals={**local, **SYMBOLS, "ceil": sympy.ceiling, "max": sympy.Max, "min": sympy.Min})
    except (sympy.SympifyError, TypeError, SyntaxError) as e:
        raise ValueError(f"{s!r} is not an expression of extents ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(d, sympy.Expr):
        raise ValueError(f"{s!r} is not an expression of extents")
    return d


def dim_str(d: Dim) -> str:
    return str(d)


def is_static(d: Dim) -> bool:
    return not isinstance(d, Dynamic)


def concrete(d: Dim) -> int | None:
    """The dim's int value when it has one."""
    if isinstance(d, Dynamic) or not d.is_Integer:
        return None
    return int(d)


def _shape(xs: tuple) -> tuple[Dim, ...]:
    return tuple(dim(x) for x in xs)


@attrs.frozen
class TensorType:
    dtype: DType
    shape: tuple[Dim, ...] = attrs.field(converter=_shape)
    placement: Placement = Placement.device

    @property
    def is_dynamic(self) -> bool:
        return any(isinstance(d, Dynamic) for d in self.shape)

    def numel(self, env: dict[str, int] | None = None) -> int:
        n = 1
        for d in self.shape:
            if isinstance(d, Dynamic):
                raise ValueError(f"numel of dynamic shape {self}")
            v = d.xreplace({SYMBOLS[k]: sympy.Integer(x) for k, x in env.items()}) if env else d
            if not v.is_Integer:
                raise ValueError(f"shape {self} is not concrete; unbound symbols {sorted(map(str, v.free_symbols))}")
            n *= int(v)
        return n

    def subs(self, env: dict[str, int]) -> TensorType:
        return attrs.evolve(self, shape=tuple(bind(d, env) for d in self.shape))

    def __str__(self) -> str:
        dims = ", ".join(dim_str(d) for d in self.shape)
        return f"{self.dtype.value}[{dims}]@{self.placement.value}"
