"""The fx target of a fused group: its Triton kernel's launcher, or on CPU tensors without Triton's interpreter
the group's ops one by one through the kernel table."""

from __future__ import annotations

import torch

from ..ir import Graph
from .kernels import KERNELS, kernel_kwargs
from .memo import Memo


def fused_target(g: Graph, group: list[str], stored: list[str]):
    """(kernel, fx target) of fused ``group`` of ``g`` storing ``stored``."""
    fk, run = _launcher(g, group, stored)
    return fk, _group(g, group, stored, fk, run)


_LAUNCHERS = Memo("fused kernel launchers", 4096)


def _launcher(g: Graph, group: list[str], outs: list[str]):
    """The fx target for one fused kernel: launches it on its arguments and the buffers it stores
    into (given after the arguments), and returns those buffers."""
    from .fusion import generate, load

    fk = generate(g, group, outs)
    tables = tuple(fk.args.index(t) for t in fk.tables)
    # the batch size is read off a per-row argument at launch, so sizes share one launcher
    row = fk.args.index(fk.row_arg)
    key = (fk.source, tables, row, fk.flat)
    return fk, _LAUNCHERS.get(key, lambda: _make_launcher(fk, load(fk), tables, row))


def _group(g: Graph, group: list[str], stored: list[str], fk, triton_run):
    """The fx target of a fused group: its Triton kernel, or on CPU tensors without Triton's
    interpreter (``triton_kernels.torch_on``) the group's ops one by one through the kernel table,
    storing the same buffers. One definition of each op's meaning serves both."""
    from .triton_kernels import torch_on

    nodes = [n for n in g.nodes if n.name in set(group)]
    at = {a: k for k, a in enumerate(fk.args)}
    into = {x: k for k, x in enumerate(stored)}
    kws = [kernel_kwargs(n) for n in nodes]
    n_args = len(fk.args)

    def run(*xs):
        ins, res = xs[:n_args], xs[n_args:]
        if not torch_on(res[0] if res else ins[0]):
            return triton_run(*xs)
        env: dict[str, torch.Tensor] = {}
        for n, kw in zip(nodes, kws, strict=True):
            args = [env[x] if x in env else ins[at[x]] for x in n.inputs]
            env[n.name] = KERNELS[n.op](*args, **kw, out=res[into[n.name]] if n.name in into else None)
        return res

    run.__name__ = fk.fn_name
    run.kernel = fk
    return run


def _table_dims(t: torch.Tensor) -> tuple[int, int, int]:
    """(row stride, width, rows) of a table a fused kernel indexes; a 1-D table is one row."""
    return (t.stride(0), t.shape[1], t.shape[0]) if t.dim() == 2 else (t.shape[0], t.shape[0], 1)


FLAT_BLOCK = 1024  # elements per program of a flat (elementwise) kernel past that many: rows times a row's width


def launch_rows(fn, meta: dict, n_args: int, tables: list[int], row: int, xs: tuple, flat: bool = False):
    """Launch fused kernel ``fn`` (compiled by Triton) on ``xs`` (its inputs, then the buffers it stores):
    one program per row of input ``row``, each 2-D or lookup table input passed with its (row stride,
    width, rows), the batch size and the next power of two of the batch size. A ``flat`` kernel (elementwise)
    takes BLOCK rows per program instead: the row count's next power of two, at most ``FLAT_BLOCK`` elements (a
    row as wide as its widest column block). The one launcher: the runtime's and the standalone script's (script.py)."""
    from .launch import launch

    ins, res = xs[:n_args], xs[n_args:]
    bs = ins[row].shape[0]
    strides = [v for k in tables for v in _table_dims(ins[k])]
    block = 1 << (bs - 1).bit_length()
    grid = bs
    if flat:
        widest = max((v for k, v in meta.items() if k.startswith("C")), default=1)
        block = min(block, max(1, FLAT_BLOCK // widest))
        grid = -(-bs // block)
    launch(lambda: fn[(grid,)](*ins, *strides, *res, bs, BLOCK=block, **meta), *ins, *res)
    return res


def _make_launcher(fk, fn, tables, row):
    meta, n_args, flat = dict(fk.meta), len(fk.args), fk.flat

    def run(*xs):
        return launch_rows(fn, meta, n_args, tables, row, xs, flat)

    run.__name__ = fk.fn_name
    return run
