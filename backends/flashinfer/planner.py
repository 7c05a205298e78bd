"""FlashInfer behind a compiled backend (GPU, optional extra ``flashinfer``).

One graph-mode wrapper per planner site (a ``host_call`` node of one bound plan: decode, or paged
prefill for target verify and draft extend), built on the fields the spec's ``binds`` name
(``kv_indptr``, ``kv_indices``, ``kv_last_page_len``; ``qo_indptr`` and ``custom_mask`` for
prefill), sharing one float workspace. The spec's ``host_call(DECODE, ...)`` dispatches to
``plan`` here (``PREFILL`` to ``plan_prefill``), in out_graph, before capture and before every
replay, from host indptrs only; the wrapper, kept in the site's state, becomes the planner's
metadata field, whose ``run`` the captured model calls.

Traps this handles: the decode wrapper's buffer keywords end in ``_buffer`` (the prefill
wrapper's in ``_buf``); in graph mode ``plan()`` copies the indptr and indices it is given into
the bound buffers, so it gets the host indptr it needs anyway and an empty indices view (the
graph writes the indices itself: copying them again would cost a device copy per step).
"""

from __future__ import annotations

import contextlib
import functools
import logging

import numpy as np
import torch

from attnmeta.compiler.ir.errors import UserError
from attnmeta.runtime.planning import PlanError, Site

from ..flashinfer_lib import WORKSPACE_BYTES, WrapperState, _flashinfer, _version, sample_lengths
from ..reference import ReferenceDecodePlanner, ReferenceDevicePlanner, ReferencePrefillPlanner
from .device_plan import PlanLayout, checked_planner, pack_mask

log = logging.getLogger("attnmeta.runtime.backends")

# The planner names FlashInfer specs declare (``host_call`` targets), one name each for the specs, the
# stand-ins and FlashInferDecodeAdapter. The *_on_device planners (a spec compiled with plan_on_device)
# get only a constant per size; the partition of each step is computed on the GPU.
PLANNER = "flashinfer.decode_plan"
PREFILL_PLANNER = "flashinfer.prefill_plan"
DEVICE_PLANNER = "flashinfer.decode_plan_on_device"
DEVICE_PREFILL_PLANNER = "flashinfer.prefill_plan_on_device"


def standins() -> dict:
    """The stand-ins a FlashInfer spec declares (``BackendSpec.planners``): used where no adapter
    serves the planners (a CPU machine, a test)."""
    return {PLANNER: ReferenceDecodePlanner, PREFILL_PLANNER: ReferencePrefillPlanner,
            DEVICE_PLANNER: lambda: ReferenceDevicePlanner(indptr=False),
            DEVICE_PREFILL_PLANNER: lambda: ReferenceDevicePlanner(indptr=True)}


class FlashInferDecodeAdapter:
    """Graph-mode FlashInfer wrappers for every planner site of a compiled backend: decode
    (``PLANNER``) and, for target verify and draft extend, the paged prefill wrapper
    (``PREFILL_PLANNER``). ``use_tensor_cores`` (decode) defaults to SGLang's rule: on for
    grouped-query attention with 4 or more query heads per KV head.

    ``partition``: ``"device"`` (the default) plans each step's split-KV partition on the GPU, in the
    recorded graph, after one ``plan()`` per wrapper (``flashinfer_plan``), checked against FlashInfer's
    own planner before it is trusted; ``"host"`` keeps FlashInfer's host planner every step (the lean
    C++ call for decode, ``plan()`` for prefill).

    A site's state holds its wrapper (``wrapper``), the indices view plan() is handed (``empty``),
    the lean host planner (``lean``), the GPU partition planner (``device``) and the mask packer
    (``pack``)."""

    def __init__(self, backend, num_qo_heads: int, num_kv_heads: int, head_dim: int, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16, workspace_bytes: int = WORKSPACE_BYTES, use_tensor_cores: bool | None = None,
                 partition: str = "device", workspace: torch.Tensor | None = None):
        if partition not in ("device", "host"):
            raise UserError(f"partition must be 'device' or 'host', got {partition!r}")
        self.fi = _flashinfer()  # the optional extra: fail here, not inside a step
        self.device_plans = partition == "device"
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.dtypes = (q_dtype, kv_dtype)
        self.tensor_cores = num_qo_heads // num_kv_heads >= 4 if use_tensor_cores is None else use_tensor_cores
        # FlashInfer's float workspace, shared by every wrapper (an engine's own, when it has one: wrappers
        # run one after another, so they may share it, as the engine's own wrappers do)
        self.workspace = workspace if workspace is not None else \
            torch.empty(workspace_bytes, dtype=torch.uint8, device=backend.device)
        self.sites: list[Site] = []  # every site this adapter made a wrapper for
        self._ones: dict[int, torch.Tensor] = {}
        for target, fn in ((PLANNER, self.plan), (PREFILL_PLANNER, self.plan_prefill), (DEVICE_PLANNER,
                           self.plan_on_device), (DEVICE_PREFILL_PLANNER, self.plan_prefill_on_device)):
            backend.set_planner(target, fn)

    @property
    def wrappers(self) -> dict[tuple, object]:
        """(mode, bs, planner node) -> the wrapper of that site."""
        return {(s.mode, s.bs, s.node): s.state.wrapper for s in self.sites}

    def site_of(self, wrapper) -> Site:
        """The site whose wrapper ``wrapper`` is (its state: lean and device planners)."""
        return next(s for s in self.sites if s.state.wrapper is wrapper)

    def _made(self, site: Site, make):
        """The site's wrapper, made by ``make`` (-> its ``WrapperState``) on the site's first call."""
        if not isinstance(site.state, WrapperState):
            site.state = make()
            self.sites.append(site)
        return site.state.wrapper

    def wrapper(self, site: Site):
        """The decode wrapper of ``site``, on the fields it binds."""
        def make():
            indptr, indices, last = (site.field(r) for r in ("kv_indptr", "kv_indices", "kv_last_page_len"))
            return WrapperState(self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, use_tensor_cores=self.tensor_cores,
                paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last),
                empty=indices[:0])
        return self._made(site, make)

    def plan(self, site: Site, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor, on_device: bool = False):
        w, st = self.wrapper(site), site.state
        if indptr_host.shape[0] <= 1:  # no rows (a TBO child of a batch of one): nothing to plan or attend
            return w
        if self._on_gpu(site):
            return w
        if st.lean is not None:
            st.lean(indptr_host)
            return w
        hq, hkv, d = self.heads

        def replan(indptr: torch.Tensor) -> None:
            with self._workspace_checked():
                w.plan(indptr, st.empty, last_page_len_host, hq, hkv, d, 1,
                       q_data_type=self.dtypes[0], kv_data_type=self.dtypes[1])
        replan(indptr_host)
        st.device = self._device_planner(site, w, self.tensor_cores, replan, indptr_host)
        if on_device:
            return self._required(site, "decode")
        if st.device is None:
            st.lean = lean_planner(self.fi, w, self.heads, indptr_host.shape[0] - 1)
        return w

    def plan_on_device(self, site: Site, last_page_len_host: torch.Tensor):
        """A spec compiled with ``plan_on_device`` has no host indptr: the wrapper's one ``plan()`` (which
        fixes the shape of the work) runs on requests of one token each, then its partition is planned on
        the GPU every step; where that cannot be (another FlashInfer, a check that fails), it is an error,
        as nothing on the host could plan a step."""
        w = self.wrapper(site)
        if self._on_gpu(site):  # every step after the first: no synthetic indptr to build
            return w
        bs = last_page_len_host.shape[0]
        return self.plan(site, torch.arange(bs + 1, dtype=torch.int32), last_page_len_host, on_device=True)

    def plan_prefill_on_device(self, site: Site, qo_indptr_host: torch.Tensor):
        """As ``plan_on_device``, for target verify and draft extend: the first plan's keys are the query
        rows themselves."""
        return self.plan_prefill(site, qo_indptr_host, qo_indptr_host, on_device=True)

    def _required(self, site: Site, what: str):
        if site.state.device is None:
            why = ("this adapter was made with partition='host'" if not self.device_plans else
                   f"the device planner does not repeat FlashInfer {self.fi.__version__}'s {what} planner for this "
                   f"wrapper (it repeats {', '.join('.'.join(map(str, v)) for v in DEVICE_PLAN_VERSIONS)}; a "
                   "disagreement is logged)")
            raise PlanError(f"the backend was compiled with plan_on_device, so no step has host indptrs to plan "
                            f"from, but {why}; compile without --plan-on-device "
                            "(backend=FlashInferOptions(plan_on_device=False))")
        return site.state.wrapper

    @staticmethod
    def _on_gpu(site: Site) -> bool:
        """Whether the site's partition is planned on the GPU, after the metadata graph (its kernel
        was added to the site's hooks once, when it was made)."""
        return isinstance(site.state, WrapperState) and site.state.device is not None

    def _device_planner(self, site: Site, w, prefill: bool, replan, first: torch.Tensor, longest: int | None = None):
        """The wrapper's partition planned on the GPU from now on, if this FlashInfer's planner is one
        ``flashinfer_plan`` repeats and it agrees with FlashInfer on this batch and on synthetic ones
        (all short, a ramp to ``longest`` keys, by default the context length, one long among short); else
        None: a host planner."""
        if not self.device_plans or _version(self.fi) not in DEVICE_PLAN_VERSIONS \
                or getattr(w, "_jit_module", None) is not None or (prefill and w._backend != "fa2"):
            return None
        hq, hkv, _ = self.heads
        bs = first.shape[0] - 1
        if prefill:
            dev = w._int_workspace_buffer.device  # FlashInfer sizes its grid by the GPU's SMs (off a GPU: tests)
            sms = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else \
                site.options.sm_count
            layout = PlanLayout.prefill_plan(w._plan_info, bs, (hq, hkv), 1, sms)
        else:
            layout = PlanLayout.decode(w._plan_info, bs, 1)
        samples = [torch.cat([torch.zeros(1, dtype=torch.int32), x.cumsum(0, dtype=torch.int32)])
                   for x in sample_lengths(bs, min(longest or site.options.max_context_len,
                                                   site.options.max_context_len))]
        planner = checked_planner(layout, w._paged_kv_indptr_buf, w._qo_indptr_buf if prefill else None,
                                  w._int_workspace_buffer, replan, [*samples, first.clone()], lambda: w._plan_info)
        if planner is None:
            log.warning("FlashInfer %s: the device planner does not match FlashInfer's for this %s wrapper "
                        "(bs %d): FlashInfer plans its steps on the host", self.fi.__version__,
                        "prefill" if prefill else "decode", bs)
            return None
        site.after_graph(planner)
        site.host_free = True  # every later step's partition is planned in the graph: no host input read
        return planner

    @contextlib.contextmanager
    def _workspace_checked(self):
        """FlashInfer's plan() sizes its split-KV scratch for the captured batch inside our workspace;
        a workspace too small for it is the caller's setting to change, said so."""
        try:
            yield
        except RuntimeError as e:
            if "workspace buffer size" not in str(e):
                raise
            raise PlanError(f"FlashInfer's workspace ({self.workspace.numel() >> 20} MiB) is too small for this "
                            f"batch's plan: {str(e).splitlines()[-1].strip()} Pass a larger "
                            "FlashInferDecodeAdapter(..., workspace_bytes=...): large batches of target verify or "
                            "draft extend need more than decode") from None

    def prefill_wrapper(self, site: Site):
        """The paged prefill wrapper of ``site``: on its qo/kv indptr, kv indices and last-page fields;
        in target verify (a ``custom_mask`` binding) with packed-mask buffers of its own, which plan()
        fills from the drafter's mask."""
        def make():
            qo, kv, idx, last = (site.field(r) for r in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"))
            mask = site.fields.get("custom_mask")
            extra, pack = {}, None
            if mask is not None:  # one bit per mask entry, plus a byte of rounding per request
                bs = qo.numel() - 1  # this size's requests use the mask's first bs / max_bs
                size = min(mask.numel() // 8 + qo.numel(), mask.numel() // site.max_bs * bs // 8 + bs + 1)
                extra = dict(custom_mask_buf=torch.zeros(size, dtype=torch.uint8, device=qo.device),
                             mask_indptr_buf=torch.zeros_like(qo))
                pack = functools.partial(pack_mask, mask, qo, kv, extra["custom_mask_buf"], extra["mask_indptr_buf"],
                                         mask.numel() // site.max_bs)
            if pack is not None:
                site.after_graph(pack)  # every step packs its mask, before any partition kernel
            return WrapperState(self.fi.BatchPrefillWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo, paged_kv_indptr_buf=kv,
                paged_kv_indices_buf=idx, paged_kv_last_page_len_buf=last, backend="fa2", **extra),
                empty=idx[:0], pack=pack)
        return self._made(site, make)

    def plan_prefill(self, site: Site, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor,
                     on_device: bool = False):
        """Target verify: the tree mask the drafter wrote into ``custom_mask`` (rows of ``qo_len x kv_len``
        per request, as FlashInfer lays it out), no causal mask. Draft extend: causal. The mask is packed
        to bits in the recorded graph, after the metadata and before attention (``pack_mask``), so
        plan() is handed the packed buffer itself: its copy into that buffer is a no-op."""
        w, st = self.prefill_wrapper(site), site.state
        if self._on_gpu(site):
            return w
        bs = qo_indptr_host.shape[0] - 1
        if bs == 0:
            return w
        ones = self._ones.get(bs)
        if ones is None:
            ones = self._ones[bs] = torch.ones(bs, dtype=torch.int32)
        hq, hkv, d = self.heads
        masked = st.pack is not None
        qo_host = qo_indptr_host.clone()
        # the window layers' wrapper (the spec's plan_window): FlashInfer compiles its window into the kernel plan()
        # picks, so it is planned with the window the engine's forward passes (SGLang: the layer's window), causal
        window = site.options.sliding_window if site.node.endswith("plan_window") else -1
        extra = {} if window < 0 else {"window_left": window}

        def replan(kv_indptr: torch.Tensor) -> None:
            with self._workspace_checked():
                w.plan(qo_host, kv_indptr, st.empty, ones, hq, hkv, d, 1,
                       packed_custom_mask=w._custom_mask_buf if masked else None, causal=not masked,
                       q_data_type=self.dtypes[0], kv_data_type=self.dtypes[1], **extra)
        replan(kv_indptr_host)
        if site.mode.is_target_verify() or site.mode.is_draft_extend():  # a fixed query layout: the partition
            # follows the kv alone; a window's stream holds at most W + its queries per request, so the device
            # planner is checked against FlashInfer's (which bounds a request's keys by the window) on those
            longest = window + site.options.num_draft_tokens if window >= 0 else None
            st.device = self._device_planner(site, w, True, replan, kv_indptr_host, longest)
        return self._required(site, "prefill") if on_device else w


LEAN_VERSIONS = ((0, 6),)  # FlashInfer versions whose decode plan() internals lean_planner repeats
DEVICE_PLAN_VERSIONS = ((0, 6),)  # ... and whose graph-mode planners flashinfer_plan computes on the GPU


def lean_planner(fi, w, heads: tuple[int, int, int], bs: int):
    """The rest of a graph-mode decode wrapper's ``plan()`` calls, for pages of one token, once the
    first full ``plan()`` has set the wrapper up: only its C++ planner, on the host indptr. What
    ``plan()`` does around it per step is skipped: two host-to-device copies into buffers the
    recorded graph writes itself, host dtype and module lookups that never change, and a Python
    ``max`` over the lengths that iterates the tensor element by element (the reason the tensor-core
    ``plan()`` grew with the batch). Only for the FlashInfer versions whose internals this repeats
    (``LEAN_VERSIONS``) and the wrapper kinds it knows; otherwise None: ``plan()`` every step."""
    if _version(fi) not in LEAN_VERSIONS or getattr(w, "_jit_module", None) is not None:
        return None
    hq, hkv, d = heads
    module, fws, iws, pws = w._cached_module, w._float_workspace_buffer, w._int_workspace_buffer, \
        w._pin_memory_int_workspace_buffer
    if w.use_tensor_cores:
        if w._backend != "fa2":
            return None
        qo = torch.arange(bs + 1, dtype=torch.int32)
        lens = torch.empty(bs, dtype=torch.int32)
        lens_np = lens.numpy()

        def plan_tc(indptr_host: torch.Tensor) -> None:
            ind = indptr_host.numpy()
            np.subtract(ind[1:], ind[:-1], out=lens_np)  # pages of one token: a row's length is its page count
            w._max_kv_len = int(lens_np.max())
            w._plan_info = module.plan(fws, iws, pws, qo, indptr_host, lens, bs, bs, hq, hkv, 1, True, d, d,
                                       False, -1, -1, False, 0)
        return plan_tc
    q_empty, kv_empty = torch.empty(0, dtype=w._cached_q_data_type), torch.empty(0, dtype=w._cached_kv_data_type)
    soft_cap = w._logits_soft_cap or 0.0

    def plan_cuda_cores(indptr_host: torch.Tensor) -> None:
        w._plan_info = module.plan(fws, iws, pws, indptr_host, bs, hq, hkv, 1, True, -1, soft_cap, d, d,
                                   q_empty, kv_empty)
    return plan_cuda_cores
