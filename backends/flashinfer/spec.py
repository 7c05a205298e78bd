"""FlashInfer decode metadata, declared once.

SGLang plans every FlashInfer wrapper with page_size 1 and a constant
all-ones ``kv_last_page_len``, so ``kv_indices`` are token-slot indices even
on a paged pool. ``plan()`` needs the indptr on the host: it is computed from
the host mirror ``seq_lens_cpu``, never by copying the device indptr back.
"""

from __future__ import annotations

import attrs

from attnmeta.backends.flashinfer.planner import (
    DEVICE_PLANNER,
    DEVICE_PREFILL_PLANNER,
    PLANNER,
    PREFILL_PLANNER,
    standins,
)
from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Kind, Placement, SpecBuilder
from attnmeta.compiler.ir.errors import OptionsError

from ..common import (
    decode_inputs,
    extend_lens,
    host_seq_lens,
    prefix_lens,
    verify_headroom,
    verify_mask,
    window_slots,
    window_stream,
)
from ..tree import visible_drafts

I32, I64 = DType.int32, DType.int64


@attrs.frozen
class FlashInferOptions:
    """FlashInfer's own options (``CompileOptions(backend=FlashInferOptions(...))``; also its TBO and multi-step
    forms)."""

    # the split-KV partition is planned on the GPU every step (FlashInferDecodeAdapter's device planner), so
    # out_graph computes no host indptrs for plan(): no host op per step
    plan_on_device: bool = False


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    if options.sliding_window and mode is ForwardMode.EXTEND:
        raise OptionsError("attnmeta's flashinfer spec plans sliding-window layers for decode, target verify and "
                           "draft extend, not extend (prefill runs SGLang's own wrappers)")
    if options.sliding_window and mode.is_target_verify() and options.topk > 1 and \
            not options.of(FlashInferOptions).plan_on_device:
        # each draft query's window stream holds the drafts its tree-mask row shows: lengths only the GPU knows
        raise OptionsError(f"attnmeta's flashinfer spec verifies a sliding-window model's draft tree (topk "
                           f"{options.topk}) with the window wrapper's partition planned on the GPU only: its "
                           "streams' lengths come from the tree mask, which the host never sees; compile with "
                           "backend=FlashInferOptions(plan_on_device=True) (SGLang: leave ATTNMETA_PLANNER unset), "
                           "or use --speculative-eagle-topk 1")
    b = SpecBuilder(f"flashinfer.{mode.name.lower()}")
    room = verify_headroom(mode, options)
    seq_lens, rpi, req_to_token = decode_inputs(b, room)
    seq_lens_cpu = host_seq_lens(b, room)
    on_device = options.of(FlashInferOptions).plan_on_device
    if mode.is_target_verify():
        return verify(b, seq_lens, seq_lens_cpu, rpi, req_to_token, options)
    if mode.is_draft_extend():
        return draft_extend(b, seq_lens, seq_lens_cpu, rpi, req_to_token, options)
    if mode is ForwardMode.EXTEND:
        return extend(b, rpi, req_to_token)
    win = {}
    if options.sliding_window:
        # the window layers' wrapper reads the last min(seq, SW + 1) tokens: FlashInfer's window counts the current
        # one besides the SW before it
        win = window_stream(b, seq_lens, rpi, req_to_token, options, past=1)
        del win["window_kv_lens"], win["window_kv_start"]
    with b.in_graph():
        kv_indptr = b.cumsum(seq_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, seq_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
        last_page_len = b.full(1, ["bs"], I32, name="kv_last_page_len")
    host = {}
    with b.out_graph():
        if not on_device:
            host["kv_indptr_host"] = b.cumsum(seq_lens_cpu, name="kv_indptr_host")
        last_page_len_host = b.full(1, ["bs"], I32, Placement.host, name="kv_last_page_len_host")
        plan = b.host_call(DEVICE_PLANNER if on_device else PLANNER, *host.values(), last_page_len_host, name="plan",
                           binds=dict(kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len))
        if win:  # the window layers' wrapper, planned as the full layers' over the window's stream
            if not on_device:
                host["window_kv_indptr_host"] = b.cumsum(b.ewise("min", seq_lens_cpu, options.sliding_window + 1),
                                                         name="window_kv_indptr_host")
            win["plan_window"] = b.host_call(
                DEVICE_PLANNER if on_device else PLANNER,
                *([] if on_device else [host["window_kv_indptr_host"]]), last_page_len_host, name="plan_window",
                binds=dict(kv_indptr=win["window_kv_indptr"], kv_indices=win["window_kv_indices"],
                           kv_last_page_len=last_page_len))
    b.outputs(kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len, plan=plan,
              ragged=_ragged(win), **host, **win)
    return b.build()


def _prefill_plan(b: SpecBuilder, qo_host, kv_lens_cpu, on_device: bool, binds: dict,
                  name: str = "plan") -> tuple[object, dict]:
    """The prefill planner node ``name``, in out_graph, planning into ``binds``: from the host indptrs, or
    (plan_on_device) from the constant query indptr alone. Returns it and the host kv indptr field,
    if any."""
    with b.out_graph():
        if on_device:
            return b.host_call(DEVICE_PREFILL_PLANNER, qo_host, name=name, binds=binds), {}
        field = "kv_indptr_host" if name == "plan" else f"{name.removeprefix('plan_')}_kv_indptr_host"
        kv_host = b.cumsum(kv_lens_cpu, name=field)
        return b.host_call(PREFILL_PLANNER, qo_host, kv_host, name=name, binds=binds), {field: kv_host}


def _prefill_window(b: SpecBuilder, keys, keys_cpu, rpi, req_to_token, options: CompileOptions, qo_indptr, qo_host,
                    last_page_len) -> dict:
    """The window layers' prefill wrapper (SGLang's first), beside the full layers': each request's Q queries
    sit at the end of its ``keys`` (verify: its drafts; draft extend: its slots), so the last min(keys, SW + Q) of
    them hold every key a query's window reaches. The wrapper is planned causal with FlashInfer's ``window_left``
    SW (the planner's ``plan_window`` site): FlashInfer counts a query's place back from the end of its request's
    list, which with the queries last in a contiguous stream is its place in the sequence, so the window is exact
    per query. No tree mask: at topk 1 the drafts are a chain, which causal is. Nothing without a window."""
    if not options.sliding_window:
        return {}
    Q, on_device = options.num_draft_tokens, options.of(FlashInferOptions).plan_on_device  # verify's D, extend's T
    win = window_stream(b, keys, rpi, req_to_token, options, past=Q, tokens=f"{Q}*bs")
    del win["window_kv_lens"], win["window_kv_start"]
    with b.out_graph():
        lens_cpu = None if on_device else b.ewise("min", keys_cpu, options.sliding_window + Q)
    win["plan_window"], host = _prefill_plan(b, qo_host, lens_cpu, on_device, dict(
        qo_indptr=qo_indptr, kv_indptr=win["window_kv_indptr"], kv_indices=win["window_kv_indices"],
        kv_last_page_len=last_page_len), name="plan_window")
    return win | host


def _tree_window(b: SpecBuilder, seq_lens, rpi, req_to_token, options: CompileOptions, mask) -> dict:
    """The window layers' prefill wrapper of a tree verify (topk > 1): one batch item per draft query, r = i * D + j,
    its keys the last min(seq_i, SW) cached ones followed by the drafts its tree-mask row shows (``visible_drafts``:
    its ancestors and itself, in draft order), planned causal with FlashInfer's ``window_left`` SW as the engine's
    forward passes it. A query is its item's last key, so FlashInfer's window keeps the item's last SW + 1 keys:
    the d + 1 drafts a query at depth d sees and the SW - d cached keys before it, exactly its window. (One item per
    request, as at topk 1, would count each query's window from its list index, not its depth.) The item's stream
    is two gathers added: the cached keys' slots (zero past them) and the visible drafts' (zero before them); the
    window pool's slots where there is one, with the D write slots per request."""
    D, SW = options.num_draft_tokens, options.sliding_window
    Z = f"{D}*bs"
    out = {}
    with b.in_graph():
        t = visible_drafts(b, D, seq_lens, rpi, mask)
        keep = b.ewise("min", t.seq, SW)
        lens = b.ewise("add", keep, t.count, name="window_kv_lens")
        indptr = out["window_kv_indptr"] = b.cumsum(lens, name="window_kv_indptr")
        zero, cap = b.full(0, [Z], I32), f"max_bs*{D}*(SW+{D})"
        past = b.full(1 << 30, [Z], I32)  # columns no row has: entries past the cached keys read nothing (0)
        cached = b.ragged_gather(req_to_token, t.rows, lens, indptr, capacity=cap,
                                 jump=(zero, b.ewise("sub", t.seq, keep), keep, past))
        drafts = b.gather_rows(req_to_token, t.rows, t.columns)  # [D*bs, D]: the visible drafts' slots first
        shown = b.ragged_gather(drafts, b.arange(Z), lens, indptr, capacity=cap,
                                jump=(zero, b.ewise("sub", zero, keep)))
        idx = b.ewise("add", cached, shown, name="window_kv_full" if options.window_pool else "window_kv_indices")
        out |= window_slots(b, idx, options, Z)
        idx = out["window_kv_indices"]
        out["window_qo_indptr"] = qo = b.arange(f"{Z} + 1", name="window_qo_indptr")
        last = out["window_kv_last_page_len"] = b.full(1, [Z], I32, name="window_kv_last_page_len")
    with b.out_graph():
        qo_host = b.arange(f"{Z} + 1", placement=Placement.host, name="window_qo_indptr_host")
    out["plan_window"], _ = _prefill_plan(b, qo_host, None, True, dict(
        qo_indptr=qo, kv_indptr=indptr, kv_indices=idx, kv_last_page_len=last), name="plan_window")
    return out


def verify(b: SpecBuilder, seq_lens, seq_lens_cpu, rpi, req_to_token, options: CompileOptions) -> Graph:
    """Target verify (EAGLE): D query tokens per request over the prefix plus the D drafts; the
    tree-mask rows of request i start at mask_indptr[i]. plan() gets host indptrs computed from
    the host mirror, never a device->host copy at replay."""
    D, on_device = options.num_draft_tokens, options.of(FlashInferOptions).plan_on_device
    with b.in_graph():
        kv_lens = b.ewise("add", seq_lens, D)
        qo_indptr = b.arange("bs + 1", step=D, name="qo_indptr")
        kv_indptr = b.cumsum(kv_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, kv_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
        mask_indptr = b.cumsum(b.ewise("mul", kv_lens, D), name="mask_indptr")
        custom_mask = verify_mask(b, D)
        last_page_len = b.full(1, ["bs"], I32, name="kv_last_page_len")
    with b.out_graph():
        qo_host = b.arange("bs + 1", step=D, placement=Placement.host, name="qo_indptr_host")
        kv_lens_cpu = None if on_device else b.ewise("add", seq_lens_cpu, D)
    plan, host = _prefill_plan(b, qo_host, kv_lens_cpu, on_device, dict(
        qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len,
        custom_mask=custom_mask))
    if options.sliding_window and options.topk > 1:
        win = _tree_window(b, seq_lens, rpi, req_to_token, options, custom_mask)
    else:
        win = _prefill_window(b, kv_lens, kv_lens_cpu, rpi, req_to_token, options, qo_indptr, qo_host,
                              last_page_len)
    b.outputs(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, mask_indptr=mask_indptr,
              custom_mask=custom_mask, kv_last_page_len=last_page_len, plan=plan, ragged=_ragged(win), **host, **win)
    return b.build()


def _ragged(win: dict) -> dict:
    return {"kv_indices": "kv_indptr"} | ({"window_kv_indices": "window_kv_indptr"} if win else {})


def draft_extend(b: SpecBuilder, seq_lens, seq_lens_cpu, rpi, req_to_token, options: CompileOptions) -> Graph:
    """Draft extend (EAGLE, SGLang's V2 layout): T query slots per request at a fixed stride, the
    accepted tokens first; keys are the whole sequence (seq_lens counts the T slots). The kernel
    and plan() read the same qo_indptr: graph-mode plan() copies the host indptr it is given into
    the buffer the kernel reads, so both are the static stride and the kv indptr comes from the
    host mirror; replay never copies device indptrs back."""
    T, on_device = options.num_draft_tokens, options.of(FlashInferOptions).plan_on_device
    with b.in_graph():
        qo_indptr = b.arange("bs + 1", step=T, name="qo_indptr")
        kv_indptr = b.cumsum(seq_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, seq_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
        last_page_len = b.full(1, ["bs"], I32, name="kv_last_page_len")
    with b.out_graph():
        qo_host = b.arange("bs + 1", step=T, placement=Placement.host, name="qo_indptr_host")
    plan, host = _prefill_plan(b, qo_host, seq_lens_cpu, on_device, dict(
        qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len))
    win = _prefill_window(b, seq_lens, seq_lens_cpu, rpi, req_to_token, options, qo_indptr, qo_host, last_page_len)
    b.outputs(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len,
              qo_indptr_host=qo_host, plan=plan, ragged=_ragged(win), **host, **win)
    return b.build()


def extend(b: SpecBuilder, rpi, req_to_token) -> Graph:
    """Extend (prefill), run eagerly: the new tokens attend to themselves (ragged, qo_indptr for q
    and k) and to the cached prefix (paged: kv over extend_prefix_lens). Host indptrs for plan()
    come from the host mirrors."""
    ext, prefix = extend_lens(b, hi=None), prefix_lens(b)
    ext_cpu = b.input("extend_seq_lens_cpu", I32, ["bs"], Placement.host, fill=1, kind=Kind.length)
    prefix_cpu = b.input("extend_prefix_lens_cpu", I32, ["bs"], Placement.host, fill=0, kind=Kind.length)
    with b.in_graph():
        qo_indptr = b.cumsum(ext, name="qo_indptr")
        kv_indptr = b.cumsum(prefix, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, prefix, kv_indptr, capacity="max_bs*L", name="kv_indices")
        last_page_len = b.full(1, ["bs"], I32, name="kv_last_page_len")
    with b.out_graph():
        qo_host = b.cumsum(ext_cpu, name="qo_indptr_host")
        kv_host = b.cumsum(prefix_cpu, name="kv_indptr_host")
        plan = b.host_call(PREFILL_PLANNER, qo_host, kv_host, name="plan", binds=dict(
            qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len))
    b.outputs(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len,
              qo_indptr_host=qo_host, kv_indptr_host=kv_host, plan=plan, ragged={"kv_indices": "kv_indptr"})
    return b.build()


MODES = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND, ForwardMode.EXTEND)
SPEC = BackendSpec("flashinfer", build, MODES,
                   doc="FlashInfer paged decode: kv_indptr, kv_indices, kv_last_page_len, host plan()",
                   headroom=verify_headroom, planners=standins(), options_type=FlashInferOptions, windows=True)
