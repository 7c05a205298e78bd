"""Where an engine's host time goes, for ``tests/gpu/sglang_engine.py`` under ``ATTNMETA_ENGINE_PROFILE``.

Installed in every process of SGLang's engine (its scheduler re-imports the engine script), this wraps, at
class level, the calls a decode step or an EAGLE round spends host time in:

- ``metadata``: every attention backend's ``init_forward_metadata_out_graph`` (SGLang's own and
  attnmeta's; the outermost call only, so a subclass calling its parent counts once);
- ``load_batch``: each graph runner's ``load_batch`` (the view, the inputs' copies, the metadata);
- ``graph_replay``: ``torch.cuda.CUDAGraph.replay`` (the launch);
- ``forward``: ``ModelRunner.forward`` (a whole forward of the target or the draft, eager or replayed);
- ``sync``: ``torch.cuda.Stream.synchronize`` / ``Event.synchronize`` and a device tensor's ``tolist`` /
  ``item`` / ``cpu``, the host waiting for the GPU; ``sync_sites`` counts, after the mark, where each was
  called from (the first two frames outside torch): a wait a backend adds shows by file and line;
- ``staged``: after the mark, each step an attnmeta backend staged instead of replaying on the engine's own
  buffers, by backend class, mode and size, with why (no graph bound to the engine's buffers, or which bound
  buffer the view did not hand: another tensor, or too few values).

Each call's duration is kept; the scheduler process writes the medians, totals and counts to
``$ATTNMETA_ENGINE_PROFILE.<pid>.json`` every few hundred calls (SGLang kills its scheduler on shutdown, so
there is no exit hook to wait for). ``after_mark`` counts only the calls made while the parent's marker file
exists (``mark()`` ... ``unmark()`` around the timed decodes)."""

from __future__ import annotations

import functools
import json
import os
import statistics
import threading
import time

_local = threading.local()
_calls: dict[str, list[float]] = {}
_after: dict[str, list[float]] = {}
_sites: dict[str, int] = {}  # after the mark: where each wait on the GPU was called from, and how often
_staged: dict[str, int] = {}  # after the mark: attnmeta's staged steps, and why they were not replays
_state = {"n": 0, "marked": False, "checked": 0.0}


def _path() -> str:
    return f"{os.environ['ATTNMETA_ENGINE_PROFILE']}.{os.getpid()}.json"


def _flush() -> None:
    def summary(table):
        return {k: {"n": len(v), "median_us": round(statistics.median(v) * 1e6, 1), "total_ms": round(sum(v) * 1e3, 2)}
                for k, v in table.items() if v}
    with open(_path(), "w") as f:
        json.dump({"all": summary(_calls), "after_mark": summary(_after),
                   "sync_sites": dict(sorted(_sites.items(), key=lambda kv: -kv[1])),
                   "staged": dict(sorted(_staged.items(), key=lambda kv: -kv[1]))}, f)


def _site() -> str:
    """The caller of a wait on the GPU: the first frame outside torch and this file, and its caller."""
    import sys

    f, out = sys._getframe(2), []
    while f is not None and len(out) < 2:
        path = f.f_code.co_filename
        if "/torch/" not in path and not path.endswith("engine_profile.py"):
            out.append(f"{'/'.join(path.split('/')[-2:])}:{f.f_lineno} {f.f_code.co_name}")
        f = f.f_back
    return " < ".join(out)


def _unbacked(backend, fb) -> str:
    """Why an attnmeta backend's step on ``fb`` is no replay on the engine's buffers (read, not called)."""
    import torch

    from attnmeta.integrations.sglang.batch import ENGINE_PATHS
    from attnmeta.runtime.engine import Sources

    b = backend._replays.get((fb.forward_mode, fb.batch_size))
    if b is None:
        return "no replay captured for this mode and size"
    bad = []
    for e in b.engine:
        t = None
        for p in Sources(ENGINE_PATHS).of(e.name):
            try:
                t = p.get(fb)
            except AttributeError:
                continue
            if t is not None:
                break
        if not isinstance(t, torch.Tensor):
            bad.append(f"{e.name}: not a tensor")
        elif t.data_ptr() != e.tensor.data_ptr():
            bad.append(f"{e.name}: another tensor than the captured buffer")
        elif t.numel() < e.n:
            bad.append(f"{e.name}: {t.numel()} values < {e.n}")
    return "; ".join(bad) or "the bound buffers, but not what the replay also requires (the verify mask's buffer)"


def _why_staged() -> None:
    """Wrap attnmeta's SGLang adapter (outside the ``metadata`` timing) to count the steps it stages."""
    try:
        from attnmeta.integrations.sglang.served import CompiledModes
        from attnmeta.runtime.compiled import CompiledAttentionBackend
    except ImportError:
        return
    fn = CompiledModes.__dict__["init_forward_metadata_out_graph"]
    if getattr(fn, "_why", False):
        return

    @functools.wraps(fn)
    def counted(self, fb, in_capture=False):
        _local.staged = False
        out = fn(self, fb, in_capture)
        if _local.staged and _state["marked"] and not in_capture:
            try:
                why = _unbacked(self, fb)
            except Exception as e:  # noqa: BLE001 - a diagnosis must not break the engine
                why = f"(diagnosis failed: {type(e).__name__}: {e})"
            key = f"{type(self).__name__} {fb.forward_mode.name} bs={fb.batch_size}: {why}"
            _staged[key] = _staged.get(key, 0) + 1
        return out

    staging = CompiledAttentionBackend.__dict__["init_forward_metadata_out_graph"]

    @functools.wraps(staging)
    def flagged(self, *a, **k):
        _local.staged = True
        return staging(self, *a, **k)

    CompiledAttentionBackend.init_forward_metadata_out_graph = flagged
    counted._why = True
    CompiledModes.init_forward_metadata_out_graph = counted


def _record(key: str, dt: float) -> None:
    now = time.perf_counter()
    if now - _state["checked"] > 0.2:  # the parent's marker, looked at five times a second, not per call
        _state["checked"] = now
        marked = os.path.exists(os.environ["ATTNMETA_ENGINE_PROFILE"] + ".mark")
        if _state["marked"] and not marked:
            _flush()  # the timed decodes are over: what they spent is on disk before anything else runs
        _state["marked"] = marked
    _calls.setdefault(key, []).append(dt)
    if _state["marked"]:
        _after.setdefault(key, []).append(dt)
        if key == "sync":
            site = _site()
            _sites[site] = _sites.get(site, 0) + 1
    _state["n"] += 1
    if _state["n"] % 500 == 0:
        _flush()


def _wrap(cls, name: str, key: str, outermost: bool = False, inherited: bool = False, when=None) -> None:
    fn = getattr(cls, name, None) if inherited else cls.__dict__.get(name)
    if fn is None or getattr(fn, "_profiled", False):
        return

    @functools.wraps(fn)
    def timed(*a, **k):
        if (outermost and getattr(_local, key, False)) or (when is not None and not when(a[0])):
            return fn(*a, **k)
        setattr(_local, key, True)
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            _record(key, time.perf_counter() - t0)
            setattr(_local, key, False)

    timed._profiled = True
    setattr(cls, name, timed)


def _subclasses(cls):
    seen, todo = [], [cls]
    while todo:
        c = todo.pop()
        seen.append(c)
        todo.extend(c.__subclasses__())
    return seen


def install() -> None:
    """Wrap the calls above on every class loaded now. Called after the attention backends and graph
    runners are imported (``sglang.srt.model_executor.model_runner`` imports the runners; attnmeta's
    registration imports its kinds' classes lazily, so this also runs from ``ModelRunner.__init__``)."""
    import torch
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor import model_runner
    from sglang.srt.model_executor.runner.base_runner import BaseRunner

    for c in _subclasses(AttentionBackend):
        for k in c.__mro__:  # attnmeta's classes take the method from a mixin (CompiledModes) before SGLang's class
            _wrap(k, "init_forward_metadata_out_graph", "metadata", outermost=True)
    for c in _subclasses(BaseRunner):
        _wrap(c, "load_batch", "load_batch", outermost=True)
    _wrap(torch.cuda.CUDAGraph, "replay", "graph_replay")
    _wrap(torch.cuda.Stream, "synchronize", "sync")
    _wrap(torch.cuda.Event, "synchronize", "sync")
    for name in ("tolist", "item", "cpu"):  # C methods of the tensor base: a device tensor's waits for the GPU
        # (a host tensor's call waits for nothing: not counted, else host bookkeeping reads as syncs)
        _wrap(torch.Tensor, name, "sync", outermost=True, inherited=True, when=lambda t: t.is_cuda)
    _why_staged()
    mr = model_runner.ModelRunner
    _wrap(mr, "forward", "forward", outermost=True)
    init = mr.__dict__["__init__"]
    if not getattr(init, "_profiled", False):
        @functools.wraps(init)
        def init_then_wrap(self, *a, **k):
            init(self, *a, **k)
            install()  # the backend classes this runner imported on its way up
        init_then_wrap._profiled = True
        mr.__init__ = init_then_wrap


def mark(prefix: str) -> None:
    """The parent's side: from now on the scheduler also counts calls in ``after_mark``."""
    open(prefix + ".mark", "w").close()


def unmark(prefix: str, engine) -> None:
    """The parent's side: stop counting, and make the scheduler write what it counted (its next call
    after it saw the marker gone flushes; a one-token request makes that call)."""
    os.remove(prefix + ".mark")
    time.sleep(0.5)
    engine.generate(input_ids=[[1, 2, 3]], sampling_params={"temperature": 0.0, "max_new_tokens": 1})


def collect(prefix: str) -> dict:
    """The parent's side: the profiles the engine's processes wrote (those that made any call), by pid, and
    remove them and the marker so the next engine starts clean."""
    folder, base = os.path.split(prefix)
    out = {}
    for f in sorted(os.listdir(folder or ".")):
        if f.startswith(base + ".") and f.endswith(".json"):
            p = os.path.join(folder, f)
            with open(p) as fh:
                out[f[len(base) + 1:-5]] = json.load(fh)
            os.remove(p)
    return out
