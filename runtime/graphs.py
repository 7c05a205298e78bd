"""Graph capture and replay: torch.cuda.CUDAGraph on a GPU, and on CPU an
emulated graph with the same semantics, so CPU CI catches replay bugs.

The emulated graph records, during capture, every aten op and every kernel
launch together with the *tensor objects* it touched. Replay re-executes
exactly that record: Python logic is not re-run, scalars stay as captured,
and a buffer rebound after capture is never read, just as on a GPU. Capture
raises on host syncs (``.item()``, ``.cpu()``, ``.tolist()``, ``nonzero``,
boolean-mask indexing), which a real capture rejects or silently freezes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from attnmeta.compiler.ir.errors import ContractError, OptionsError, UserError
from attnmeta.compiler.lowering.launch import LAUNCH_HOOK


class CaptureSyncError(UserError, RuntimeError):
    """A host synchronisation was attempted inside graph capture."""

    rule = "capture-sync"


_SYNC_METHODS = {"item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__", "nonzero"}
_ALLOC_ATEN = {"aten::empty", "aten::empty_like", "aten::empty_strided"}  # no kernel: nothing to replay
_SYNC_ATEN = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_dim",
              "aten::_unique2", "aten::repeat_interleave"}


def _sync_error(what: str) -> CaptureSyncError:
    return CaptureSyncError(f"{what} inside graph capture: a host sync is illegal while capturing (on a GPU it "
                            "raises or freezes the capture-time value). Move it to out_graph and read a host "
                            "mirror such as seq_lens_cpu instead.")


class _SyncGuard(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if not self.paused and name in _SYNC_METHODS:
            raise _sync_error(f"Tensor.{name}()")
        return func(*args, **(kwargs or {}))


def _copy_into(dst, src) -> None:
    for d, s in zip(tree_flatten(dst)[0], tree_flatten(src)[0], strict=True):
        if isinstance(d, torch.Tensor):
            d.copy_(s)


class _Recorder(TorchDispatchMode):
    def __init__(self, tape: list[Callable[[], None]], memory: _Memory) -> None:
        super().__init__()
        self.tape, self.paused, self.memory = tape, False, memory

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        name = func._schema.name
        if name in _SYNC_ATEN:
            raise _sync_error(name)
        # a bool index is a mask (its count is a host sync); a bool table read at integer rows is a gather
        if name == "aten::index" and any(isinstance(t, torch.Tensor) and t.dtype == torch.bool
                                         for t in tree_flatten(args[1:])[0]):
            raise _sync_error("boolean-mask indexing")
        out = func(*args, **kwargs)
        if name in _ALLOC_ATEN or not func._schema.is_mutable and not func.is_view:
            self.memory.made(out)  # the graph pool's, made once at capture
        if func.is_view or name in _ALLOC_ATEN:
            return out  # a view aliases captured memory; an allocation is the graph pool's, made once
        self.memory.touch((args, kwargs))
        if func._schema.is_mutable:
            self.tape.append(lambda: func(*args, **kwargs))
        else:  # functional: replay recomputes and writes into the captured output (its "pool" address)
            self.tape.append(lambda: _copy_into(out, func(*args, **kwargs)))
        return out


@contextlib.contextmanager
def _triton_launches(on_launch: Callable[[Callable[[], None]], None], rec: _Recorder) -> Iterator[None]:
    """Any Triton kernel launched in the interpreter while capturing (an engine's own, launched without
    ``launch``) is one recorded launch, as a CUDA graph records it, not the interpreter's tensor traffic
    (whose shapes depend on the captured values). Launches through ``launch`` are already one."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # no Triton: no kernel to record
        yield
        return
    run = InterpretedFunction.run

    def recorded(self, *args, **kwargs):
        if rec.paused:  # inside a launch already being recorded
            return run(self, *args, **kwargs)
        on_launch(lambda: run(self, *args, **kwargs), (args, kwargs))

    InterpretedFunction.run = recorded
    try:
        yield
    finally:
        InterpretedFunction.run = run


class _Memory:
    """The storages a capture touched (aten ops' operands, launches' named tensors) and those it made (the graph
    pool's): what a captured graph reads or writes of memory it does not own is the difference, which whoever
    holds the graph must keep alive (on a GPU the graph holds addresses, not tensors)."""

    def __init__(self) -> None:
        self.touched: dict[int, torch.Tensor] = {}
        self.pool: set[int] = set()

    def made(self, out) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.pool.add(storage_key(t))

    def touch(self, xs) -> None:
        for t in tree_flatten(xs)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.touched.setdefault(storage_key(t), t)


def storage_key(t: torch.Tensor) -> int:
    """One storage's identity: its data pointer (two views of one buffer share it)."""
    return t.untyped_storage().data_ptr()


class EmulatedGraph:
    """CPU stand-in for ``torch.cuda.CUDAGraph`` with capture/replay semantics."""

    def __init__(self) -> None:
        self._tape: list[Callable[[], None]] = []
        self._memory = _Memory()
        self.captured = False

    def external(self) -> list[torch.Tensor]:
        """A tensor of every storage the captured work reads or writes that the capture did not allocate: memory
        a CUDA graph reads by address, so whoever holds the graph must hold these (runtime/bound.py)."""
        m = self._memory
        return [t for k, t in m.touched.items() if k not in m.pool]

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        if self.captured:
            raise ContractError("this graph was already captured; make a new one")
        guard, rec = _SyncGuard(), _Recorder(self._tape, self._memory)

        def on_launch(fn: Callable[[], None], tensors: tuple = ()) -> None:
            self._memory.touch(tensors)
            guard.paused = rec.paused = True  # the interpreter's own tensor traffic is not graph work
            try:
                fn()
            finally:
                guard.paused = rec.paused = False
            self._tape.append(fn)

        token = LAUNCH_HOOK.set(on_launch)
        try:
            with guard, rec, _triton_launches(on_launch, rec):
                yield
        finally:
            LAUNCH_HOOK.reset(token)
        self.captured = True

    def replay(self) -> None:
        if not self.captured:
            raise ContractError("replay() before capture()")
        with torch.no_grad():
            for op in self._tape:
                op()

    @property
    def num_ops(self) -> int:
        return len(self._tape)


class CudaGraph:
    """``torch.cuda.CUDAGraph`` behind the same capture/replay interface, sharing one pool."""

    def __init__(self, pool=None) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        with torch.cuda.graph(self.graph, pool=self.pool):
            yield
        self.captured = True

    def replay(self) -> None:
        self.graph.replay()


def new_graph(device: torch.device | str, pool=None) -> EmulatedGraph | CudaGraph:
    """A CUDA graph on a CUDA device, the emulated graph elsewhere (``device``: a torch.device or its name)."""
    return CudaGraph(pool) if _device(device).type == "cuda" else EmulatedGraph()


def _device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise OptionsError(f"device must be a torch.device or a name like 'cpu' or 'cuda:0', got {device!r} "
                        f"({str(e).splitlines()[0][:80]})") from None
