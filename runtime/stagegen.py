"""Straight-line staging code, generated once per bound plan.

``Stager.stage`` is the general path: a loop over the plan's slots that looks each field up,
accepts lists, other integer dtypes and device tensors, and explains every refusal. Almost every
step of a serving loop is the common case: each field a contiguous host tensor of the slot's
dtype (or, for a field the host never reads, a device tensor: copied device to device). For that
case this module writes one Python function per plan with every slot unrolled and every pointer,
view, bound and fill bound as a constant, so a step does no per-slot attribute lookups, calls or
branches it does not need. Anything else (a missing field, a list, another dtype, a tensor on
another device, a value out of range, IDLE) hands the whole step to the general path,
which stages it again from the start and raises the same ``BatchError`` it always did.

``source(stager)`` returns the generated code, for reading (``backend.bound(mode, bs).stager``); the function
runs from a file of it (runtime/codegen.py), never from ``exec``.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from .codegen import load


def _slot_lines(i: int, s) -> tuple[list[str], list[str], list[str], list[str]]:
    """(fetch and guard, copy and check, pad, device copy) lines for slot ``i``."""
    n = f"raw * {s.per_row}" if s.per_row > 1 else "raw"
    # a device tensor is fed (copied device to device after the packed copy) only from a field the host does not
    # mirror: a host mirror on the device goes to the general path, which refuses it by name
    host_only = s.dev is None or s.device_field is not None
    on_host = f" or not a{i}.is_cpu" if host_only else ""
    fetch = [f"a{i} = fb.{s.source}",
             f"if a{i}.__class__ is not T or a{i}.dtype is not DT{i}{on_host} "
             f"or not a{i}.is_contiguous() or a{i}.dim() != 1 or a{i}.shape[0] < {n}:",
             "    return general(fb, bs, raw, capture)"]
    copy = [f"memmove(P{i}, a{i}.data_ptr(), {n} * {s.itemsize})"]
    if not s.full_range:  # read as unsigned, a negative value is huge: one maximum checks [0, hi]
        zero_small = f" or (not capture and 0 in M{i}[:{n}])" if s.lo == 1 else ""
        zero_large = f" or (not capture and count_nonzero(SN{i}[:{n}]) != {n})" if s.lo == 1 else ""
        copy += [f"if {n} <= 16:",
                 f"    if max(U{i}[:{n}]) > {s.hi}{zero_small}:",
                 "        return general(fb, bs, raw, capture)",
                 f"elif (u := UN{i}[:{n}])[u.argmax()] > {s.hi}{zero_large}:",
                 "    return general(fb, bs, raw, capture)"]
    late = []
    total = f"bs * {s.per_row}" if s.per_row > 1 else "bs"
    if not host_only:  # a device tensor on another device: the general path explains the refusal
        copy = [f"if a{i}.is_cpu:", *("    " + x for x in copy), f"    if FTOP{i}[0]:", f"        FED{i}(None, 0)",
                f"elif a{i}.get_device() != DEVICE:", "    return general(fb, bs, raw, capture)",
                "else:", f"    LATE.append((S{i}, a{i}.view(-1)[:{n}], {n}, {s.source!r}))"]
    elif s.feed is not None:  # staged from the host: the feed back to the sentinel if a step fed it
        copy += [f"if FTOP{i}[0]:", f"    FED{i}(None, 0)"]
    # rows past the live ones hold the fill up to max_bs: the mark moves to the live count (padding the
    # rows an earlier, larger step left); a step of the same live count as the last touches nothing
    pad = [f"if DIRTY{i}[0] != {n}:", f"    PAD{i}({n}, {total})"]
    return fetch, copy, pad, late


def source(stager) -> str:
    """The generated staging function of ``stager``'s plan (general-path fallbacks included)."""
    cuda = bool(stager.copies) and stager.device.type == "cuda"
    body = ["if not raw or capture or HFLAG[0]:  # IDLE, a capture; or a device check's report to raise",
            "    return general(fb, bs, raw, capture)"]
    if cuda:  # the first step records the hazard event (general path); later ones wait on it
        body += ["ev = EVENT[0]", "if ev is None:", "    return general(fb, bs, raw, capture)",
                 "ev.synchronize()  # the previous step's copy has read the staging buffer"]
    fetch, copy, pad, late = [], [], [], []
    for i, s in enumerate(stager.slots):
        f, c, p, d = _slot_lines(i, s)
        fetch, copy, pad, late = fetch + f, copy + c, pad + p, late + d
    for k, j, bound, _ in stager.relations:  # a per-row bound between two host slots: the general path explains
        n = f"raw * {stager.slots[k].per_row}" if stager.slots[k].per_row > 1 else "raw"
        copy += [f"if a{k}.is_cpu and a{j}.is_cpu and (SN{k}[:{n}].astype(I64) - SN{j}[:{n}]).max() > {bound}:",
                 "    return general(fb, bs, raw, capture)"]
    fed = any(s.dev is not None and s.device_field is None for s in stager.slots)
    body += ["try:", *("    " + x for x in fetch),
             "except (AttributeError, IndexError, TypeError):  # a field missing, a list, a 0-d tensor",
             "    return general(fb, bs, raw, capture)", *(["LATE = []"] if fed else []), *copy, *pad]
    if stager.generation is not None:
        body += [f"GEN[0] = {stager.sizes[0]}  # the size this step staged for, and the graph's that pads it:",
                 f"GEN[1] = {stager.sizes[1]}  # the graph checks it"]
    body += [f"COPY(DEV{k}, HOST{k}, non_blocking=True)" for k in range(len(stager.copies))]
    body += ["FEED(LATE, capture)" if fed else "if WORD.value:", *([] if fed else ["    SETWORD(0)"])]
    if cuda:
        body += ["ev.record(EVENT[1])"]
    body += late
    return "def stage(fb, bs, raw, capture=False):\n" + "".join(f"    {line}\n" for line in body)


def generate(stager):
    """The generated staging function of ``stager``'s plan, its constants bound."""
    ns = {"T": torch.Tensor, "memmove": ctypes.memmove, "count_nonzero": np.count_nonzero, "I64": np.int64,
          "general": stager.stage, "FEED": stager.feed, "EVENT": stager.event, "GEN": stager.generation,
          "COPY": torch.Tensor.copy_, "HFLAG": stager.record.host_np, "WORD": stager.word, "SETWORD": stager.word.set,
          "DEVICE": stager.device.index if stager.device.type == "cuda" else -1}
    for i, s in enumerate(stager.slots):
        ns |= {f"DT{i}": s.dtype, f"P{i}": s.ptr, f"U{i}": s.umv, f"M{i}": s.mv, f"UN{i}": s.unp, f"SN{i}": s.np,
               f"DIRTY{i}": s.dirty, f"PAD{i}": s.pad, f"DEVT{i}": s.dev, f"DVIEW{i}": {}, f"S{i}": s,
               f"FTOP{i}": s.feed_top, f"FED{i}": s.fed}
    for k, (dev, host) in enumerate(stager.copies):
        ns |= {f"DEV{k}": dev, f"HOST{k}": host}
    return load("stage", source(stager).rstrip("\n").split("\n"), ns)  # written to a file and imported (codegen.py)
