"""FlashInfer's MLA planner behind a compiled backend (GPU, optional extra ``flashinfer``), and its
stand-in.

One graph-mode ``BatchMLAPagedAttentionWrapper`` per planner site, built on the four fields the
spec binds (``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``kv_lens``), sharing one float
workspace. The first call of a site runs FlashInfer's ``plan()`` (it picks the kernel module and
fixes the plan info). With ``partition="device"``, from then on, for decode and target verify (every
request the same query rows), the partition is planned on the GPU after the metadata graph
(``flashinfer_mla_plan``): checked once against FlashInfer's own planner on synthetic batches and the
first one, then no host work per step. Otherwise, and where that cannot be (another FlashInfer,
draft extend's uneven query rows, a check that disagrees), every later step runs FlashInfer's C++ planner alone on
the host arrays, as SGLang's replay path does: ``plan()`` would also copy the indptrs, the lengths
and the indices into the bound buffers, which the recorded graph writes itself. Causal everywhere
but decode, as SGLang plans it.
"""

from __future__ import annotations

import logging

import torch

from attnmeta.compiler.ir.errors import UserError
from attnmeta.runtime.planning import PlanError, Site

from ..flashinfer_lib import WORKSPACE_BYTES, WrapperState, _flashinfer, _version, sample_lengths
from ..reference import RecordingPlanner, require_host
from .device_plan import MLADevicePlanner, MLALayout, read_regions

log = logging.getLogger("attnmeta.runtime.backends")

MLA_PLANNER = "flashinfer.mla_plan"
LEAN_VERSIONS = ((0, 6),)  # FlashInfer versions whose MLA plan() internals the lean call repeats


class ReferenceMLAPlanner(RecordingPlanner):
    """Stand-in for the MLA ``plan()``: host query and kv indptrs and kv lengths, consistent with
    each other (FlashInfer 0.7 refuses lengths that disagree with the kv indptr)."""

    def __call__(self, site: Site, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor,
                  kv_lens_host: torch.Tensor):
        for name, t in (("qo_indptr", qo_indptr_host), ("kv_indptr", kv_indptr_host), ("kv_len_arr", kv_lens_host)):
            require_host(name, t)
        bs = kv_lens_host.shape[0]
        if qo_indptr_host.shape[0] != bs + 1 or kv_indptr_host.shape[0] != bs + 1:
            raise PlanError(f"MLA plan(): qo_indptr {tuple(qo_indptr_host.shape)} and kv_indptr "
                            f"{tuple(kv_indptr_host.shape)} need {bs + 1} entries for {bs} kv lengths")
        if not torch.equal(kv_indptr_host[1:] - kv_indptr_host[:-1], kv_lens_host.to(kv_indptr_host.dtype)):
            raise PlanError("MLA plan(): the kv lengths disagree with the kv indptr's steps")
        return self._record(site, bs, int(kv_indptr_host[-1]))


def standins() -> dict:
    return {MLA_PLANNER: ReferenceMLAPlanner}


class FlashInferMLAAdapter:
    """FlashInfer's MLA wrappers for every MLA planner site of a compiled backend.

    ``num_heads``: query heads on this rank; ``kv_lora_rank`` and ``qk_rope_head_dim``: the
    compressed-KV and rope widths (DeepSeek-V3: 512 and 64); ``sm_scale``: the model's softmax
    scale (SGLang's ``model_config.scaling``); ``partition``: ``"device"`` (the default: the partition
    planned on the GPU where it can be, checked against FlashInfer's first; no host planner per step,
    at a GPU cost of tens to hundreds of µs per step, docs/BENCHMARKS.md) or ``"host"`` (FlashInfer's
    C++ planner every step, about 100 µs of host time, none on the GPU). A site's state holds
    its wrapper (``wrapper``), the indices view plan() is handed (``empty``), the lean host planner
    (``lean``) and the GPU planner (``device``)."""

    def __init__(self, backend, num_heads: int, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                 sm_scale: float | None = None, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                 workspace: torch.Tensor | None = None, workspace_bytes: int = WORKSPACE_BYTES,
                 partition: str = "device"):
        if partition not in ("device", "host"):
            raise UserError(f"partition must be 'device' or 'host', got {partition!r}")
        self.device_plans = partition == "device"
        self.fi = _flashinfer()
        self.heads, self.ckv, self.kpe = num_heads, kv_lora_rank, qk_rope_head_dim
        # the scale of the unabsorbed head (nope 128 + rope 64 in DeepSeek-V3) is the model's; by default
        # that of the absorbed query width, which a caller serving a real model replaces
        self.sm_scale = sm_scale if sm_scale is not None else (kv_lora_rank + qk_rope_head_dim) ** -0.5
        self.dtypes = (q_dtype, kv_dtype)
        self.workspace = workspace if workspace is not None else \
            torch.empty(workspace_bytes, dtype=torch.uint8, device=backend.device)
        self.sites: list[Site] = []
        backend.set_planner(MLA_PLANNER, self.plan)

    def wrapper(self, site: Site):
        if not isinstance(site.state, WrapperState):
            qo, kv, idx, lens = (site.field(r) for r in ("qo_indptr", "kv_indptr", "kv_indices", "kv_lens"))
            site.state = WrapperState(self.fi.BatchMLAPagedAttentionWrapper(
                self.workspace, use_cuda_graph=True, qo_indptr=qo, kv_indptr=kv, kv_indices=idx, kv_len_arr=lens,
                backend="auto"), empty=idx[:0])
            self.sites.append(site)
        return site.state.wrapper

    def plan(self, site: Site, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor,
             kv_lens_host: torch.Tensor):
        w, st = self.wrapper(site), site.state
        if kv_lens_host.shape[0] == 0 or st.device is not None:  # no rows; or planned on the GPU
            return w
        if st.lean is not None:  # every step after the first: the C++ planner alone
            st.lean(qo_indptr_host, kv_indptr_host, kv_lens_host)
            return w
        causal = not site.mode.is_decode_or_idle()  # fixed per site: the lean planner keeps it
        w.plan(qo_indptr_host, kv_indptr_host, st.empty, kv_lens_host, self.heads, self.ckv, self.kpe, 1, causal,
               self.sm_scale, *self.dtypes)
        st.lean = lean_mla_planner(self.fi, w, self.heads, self.ckv, causal)
        if st.lean is not None and self.device_plans:
            st.device = self._device_planner(site, w, causal, qo_indptr_host, kv_indptr_host, kv_lens_host)
            site.host_free = st.device is not None  # planned in the graph from now on
        return w

    def _device_planner(self, site: Site, w, causal: bool, qo_host, kv_host, lens_host):
        """The site's partition planned on the GPU from now on, if every request has the same query rows
        (decode, verify), the plan info is one ``MLALayout`` knows, and the device planner writes what
        FlashInfer's planner writes on synthetic batches (all short, a ramp to the context length, one
        long among short) and on this one; else None. Once per site; it synchronizes."""
        bs, q = lens_host.shape[0], int(qo_host[1] - qo_host[0])
        ws = w._int_workspace_buffer
        if not torch.equal(qo_host, torch.arange(bs + 1, dtype=qo_host.dtype) * q):
            return None
        # FlashInfer sizes its grid by the GPU's SMs (off a GPU: the tests' stand-in, by the options')
        sms = torch.cuda.get_device_properties(ws.device).multi_processor_count if ws.device.type == "cuda" else \
            site.options.sm_count
        layout = MLALayout.of(w._plan_info, bs, self.heads, causal, sms)
        if layout is None:
            return None
        samples = [*sample_lengths(bs, site.options.max_context_len, short=q), lens_host.to(torch.int32)]
        try:
            agree = self._agrees(site, w, layout, q, qo_host, samples)
        except Exception as e:  # a kernel that does not build or run here: nothing to trust, so not used
            log.warning("checking the device MLA planner against FlashInfer's: %s", e)
            site.state.lean(qo_host, kv_host, lens_host)  # leave the wrapper planned for the batch at hand
            agree = False
        if not agree:
            log.warning("FlashInfer %s: the device MLA planner does not match FlashInfer's for this %s wrapper "
                        "(bs %d): FlashInfer plans its steps on the host", self.fi.__version__, site.mode.name, bs)
            return None
        planner = MLADevicePlanner(layout, *(site.field(r) for r in ("qo_indptr", "kv_indptr", "kv_lens")), ws, q)
        site.after_graph(planner)
        return planner

    @staticmethod
    def _agrees(site: Site, w, layout: MLALayout, q: int, qo_host, samples) -> bool:
        ws = w._int_workspace_buffer
        first, agree = [int(x) for x in w._plan_info], True
        for lens in samples:  # the batch at hand last: the wrapper is left planned for it
            kv = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0, dtype=torch.int32)])
            site.state.lean(qo_host.to(torch.int32), kv, lens)
            _sync(ws.device)
            if [int(x) for x in w._plan_info] != first:
                agree = False
                continue
            mine = ws.clone()
            dev = [t.to(ws.device) for t in (qo_host.to(torch.int32), kv, lens)]
            MLADevicePlanner(layout, *dev, mine, q)()
            _sync(ws.device)
            words, want = mine.view(torch.int32), ws.view(torch.int32)
            agree &= all(torch.equal(words[a:a + n], want[a:a + n]) for a, n in read_regions(layout, want))
        return agree


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def lean_mla_planner(fi, w, heads: int, ckv: int, causal: bool):
    """What a graph-mode MLA wrapper's ``plan()`` does per step once its first call has set it up,
    for the FlashInfer versions whose internals this repeats: FlashInfer's C++ planner on the host
    arrays. Else None: ``plan()`` every step."""
    if _version(fi) not in LEAN_VERSIONS or getattr(w, "_cached_module", None) is None:
        return None
    module, fws, iws, pws = w._cached_module, w._float_workspace_buffer, w._int_workspace_buffer, \
        w._pin_memory_int_workspace_buffer

    def plan(qo_indptr_host, kv_indptr_host, kv_lens_host) -> None:
        w._plan_info = module.plan(fws, iws, pws, qo_indptr_host, kv_indptr_host, kv_lens_host, heads, ckv, causal)
    return plan
