"""The device range check of a step's device-resident batch values, as Triton code, and the fused kernel
variant that runs it first.

``ingest_group`` narrows up to four fields ``src[:n]`` into the buffers the metadata kernels read,
replacing a value outside [lo, hi] by a safe one and keeping the first such value in a four-word record
(runtime/guard.py says why and what the host does with it). It runs either as a kernel of its own
(``runtime/guard.ingest``) or, where a step's metadata starts with a fused kernel, inside that kernel
before its body (``prologue_variant``): a captured step is then one graph node, not two, and a replayed
graph's launch costs the host one node's work.

Inside a fused kernel every program runs the whole check over every row, then a barrier, then its body:
programs do not exchange data, and each one writes the same narrowed values, so a program reads them
after its own writes whatever the others have done. The extra work is a few hundred loads per program.
"""

from __future__ import annotations

import hashlib
import re

import attrs
import triton
import triton.language as tl

BLOCK = 256
SLOTS = 4  # fields per group: one call of ingest_group
SCALARS = ("n", "lo", "hi", "fill", "field")  # per field, never specialized (a 1 would become a constant)


@triton.jit
def _ingest_one(src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP: tl.constexpr, PADDED: tl.constexpr,
                BLOCK: tl.constexpr):
    # src[:n] narrowed into dst[:n]; a value outside [lo, hi] replaced (a length clamped, anything else by 0),
    # a sentinel (PADDED) written as the fill; the first bad row into the record unless it already holds one
    # (set last, so a host that sees it set may read the rest after a sync).
    first = n + 0 * tl.program_id(0)  # a tensor from the start: it is carried through the loop
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(src + offs, mask=m, other=0).to(tl.int64)
        pad = m & (v == sentinel) & PADDED
        bad = m & ((v < lo) | (v > hi)) & (pad == 0)
        if CLAMP:
            safe = tl.minimum(tl.maximum(v, lo), hi)
        else:
            safe = tl.zeros_like(v)
        out = tl.where(pad, fill, tl.where(bad, safe, v))
        tl.store(dst + offs, out.to(dst.dtype.element_ty), mask=m)
        first = tl.minimum(first, tl.min(tl.where(bad, offs, n), axis=0))
    if first < n:
        if tl.load(flag) == 0:
            tl.store(flag + 1, field + 0 * first.to(tl.int64))
            tl.store(flag + 2, first.to(tl.int64))
            tl.store(flag + 3, tl.load(src + first).to(tl.int64))
            tl.store(flag, 1)


@triton.jit
def _gated(w, W: tl.constexpr, src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP: tl.constexpr,
           PADDED: tl.constexpr, BLOCK: tl.constexpr):
    if W == -1:  # resolved when compiled: an ungated field has no branch
        _ingest_one(src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP, PADDED, BLOCK)
    else:
        if w == W:
            _ingest_one(src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP, PADDED, BLOCK)


@triton.jit
def ingest_group(flag, word, sentinel,
                 src0, dst0, n0, lo0, hi0, fill0, field0, src1, dst1, n1, lo1, hi1, fill1, field1,
                 src2, dst2, n2, lo2, hi2, fill2, field2, src3, dst3, n3, lo3, hi3, fill3, field3,
                 NUM: tl.constexpr, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
                 P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
                 W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
                 GATED: tl.constexpr, BLOCK: tl.constexpr):
    # Up to four fields one after another; the first bad value of the first bad field is the one recorded, as
    # launches in this order would. Field i runs always (Wi == -1) or, on a graph bound to an engine's buffers,
    # only on the steps the word says were fed its way (Wi == word): the engine's buffers and the staged copies
    # of the same slots share one check, each side gated.
    w = 0
    if GATED:
        w = tl.load(word)
    _gated(w, W0, src0, dst0, n0, lo0, hi0, fill0, sentinel, flag, field0, C0, P0, BLOCK)
    if NUM > 1:
        _gated(w, W1, src1, dst1, n1, lo1, hi1, fill1, sentinel, flag, field1, C1, P1, BLOCK)
    if NUM > 2:
        _gated(w, W2, src2, dst2, n2, lo2, hi2, fill2, sentinel, flag, field2, C2, P2, BLOCK)
    if NUM > 3:
        _gated(w, W3, src3, dst3, n3, lo3, hi3, fill3, sentinel, flag, field3, C3, P3, BLOCK)


@attrs.frozen
class Group:
    """One call of ``ingest_group``: its field arguments (seven per slot, four slots) and its constants."""

    args: tuple
    num: int
    clamp: tuple[bool, ...]
    padded: tuple[bool, ...]
    when: tuple[int, ...]

    def constants(self) -> dict:
        """NUM, C0..C3, P0..P3, W0..W3: the order of ``ingest_group``'s parameters."""
        return {"NUM": self.num, **{f"C{i}": c for i, c in enumerate(self.clamp)},
                **{f"P{i}": c for i, c in enumerate(self.padded)}, **{f"W{i}": c for i, c in enumerate(self.when)}}


@attrs.frozen(eq=False)
class Prologue:
    """The check a step's first fused kernel runs before its body: the shared arguments (record, word,
    sentinel), its groups, and ``apart``, the same work as launches of its own (for kernels that run as torch
    ops on the CPU)."""

    head: tuple
    groups: tuple[Group, ...]
    gated: bool
    apart: object

    @property
    def key(self) -> tuple:
        return (self.gated, *((g.num, g.clamp, g.padded, g.when) for g in self.groups))

    @property
    def args(self) -> tuple:
        return self.head + tuple(a for g in self.groups for a in g.args)


_DEF = re.compile(r"^def (\w+)\((.*), n_rows, (BLOCK: tl\.constexpr.*)\):$", re.M)


def prologue_variant(source: str, fn_name: str, p: Prologue) -> tuple[str, str, list[str]]:
    """(source, function name, unspecialized parameters) of fused kernel ``source`` with ``p``'s check run
    first: its parameters after ``n_rows``, then a barrier, so every later read of a checked buffer in the
    program sees the narrowed values."""
    m = _DEF.search(source)
    if m is None or m.group(1) != fn_name:
        raise ValueError(f"{fn_name}: not a fused kernel's source (no 'def {fn_name}(..., n_rows, BLOCK...)')")
    params = ["gq_flag", "gq_word", "gq_sentinel"]
    calls, loose = [], []
    for k, g in enumerate(p.groups):
        mine = [f"gq{k}_{a}{i}" for i in range(SLOTS) for a in ("src", "dst", *SCALARS)]
        params += mine
        loose += [x for x in mine if not x.startswith((f"gq{k}_src", f"gq{k}_dst"))]
        consts = ", ".join(f"{v}" for v in g.constants().values())
        calls.append(f"    ingest_group(gq_flag, gq_word, gq_sentinel, {', '.join(mine)}, {consts}, {p.gated}, "
                     f"{BLOCK})")
    name = f"{fn_name}_g{hashlib.sha1(repr(p.key).encode()).hexdigest()[:8]}"
    head = f"def {name}({m.group(2)}, n_rows, {', '.join(params)}, {m.group(3)}):\n"
    body = "\n".join(calls) + "\n    tl.debug_barrier()  # this program's narrowed values before its body reads them\n"
    text = source[: m.start()] + head + body + source[m.end() + 1 :]
    imports = "import triton.language as tl\n"
    text = text.replace(imports, f"{imports}\nfrom attnmeta.compiler.lowering.ingest import ingest_group\n", 1)
    return text, name, loose
