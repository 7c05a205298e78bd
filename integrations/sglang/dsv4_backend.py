"""SGLang's DeepSeek-V4 attention backend with its captured-mode metadata compiled by attnmeta.

``DSV4Backend`` subclasses SGLang's ``DeepseekV4AttnBackend``: attention, KV stores, compressors,
indexers and every prefill/extend path stay SGLang's. Decode, idle, target verify and draft extend
V2 (the modes SGLang captures for DSV4) take their metadata from a compiled ``dsv4`` backend instead
of SGLang's raw-metadata upgrade: out_graph stages the batch (checked: a bad length, row or size is
a ``BatchError`` naming it), in_graph is the one recorded kernel, and ``forward_metadata`` is SGLang's
own ``DSV4Metadata`` over the compiled buffers (``dsv4.forward_metadata``), built where SGLang builds
it, so its FlashMLA and DeepGEMM schedulers are recorded in the same graph.

Features attnmeta's ``dsv4`` spec does not plan are refused when the backend is built, naming each
(use SGLang's ``dsv4`` backend for them): DeepSeek-V4.1's c1/c2 ratios, a request window or SWA
request ring, DSpark, online c128 MTP, trtllm-gen attention, context parallelism, the unified c4
request ring, and multi-step draft decode.
"""

from __future__ import annotations

from attnmeta.backends.dsv4.spec import DSV4Options
from attnmeta.compiler import CompileOptions
from attnmeta.compiler.ir.errors import ContractError, OptionsError

from .batch import BatchView
from .dsv4 import forward_metadata
from .kinds import sglang
from .options import capture_sizes
from .served import CompiledModes

_SGLangDSV4 = sglang("sglang.srt.layers.attention.deepseek_v4_backend", "DeepseekV4AttnBackend")

def unserved(b) -> list[str]:
    """What of SGLang backend ``b``'s configuration the compiled metadata does not plan."""
    pool, why = b.token_to_kv_pool, []
    checks = ((bool(getattr(b, "low_ratios", ())), "DeepSeek-V4.1's c1/c2 ratios"),
              (getattr(pool, "request_window", None) is not None, "a request window"),
              (getattr(pool, "swa_req_ring_size", None) is not None, "an SWA request ring"),
              (bool(getattr(pool, "_unified_kv", False)), "the unified c4 request ring"),
              (bool(getattr(b, "is_dspark_draft", False)), "DSpark drafting"),
              (bool(getattr(b, "trtllm_attn", False)), "trtllm-gen attention"),
              (getattr(b, "is_draft_runner", False) and (b.speculative_num_steps or 0) > 1,
               "multi-step draft decode (one out_cache_loc shared by the steps)"))
    why += [name for bad, name in checks if bad]
    mtp = getattr(b, "online_c128_mtp", None)
    if mtp is not None and mtp.enabled():
        why.append("online c128 MTP")
    try:
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().attn_cp_size != 1:
            why.append("context parallelism")
    except Exception:  # noqa: BLE001 - no parallel state published: a single process, no CP
        pass
    return why


def dsv4_options(b, **overrides):
    """The compile options SGLang's DSV4 backend ``b`` implies: its server's capture sizes and
    speculative settings, the request table's width as the context, the model's ``index_topk``, the
    pool's compression ratios."""
    modes = ("decode", "idle", "target_verify", "draft_extend") if b.mtp_enabled else ("decode", "idle")
    ratios = tuple(r for r in b.present_ratios if r in (4, 128))
    sizes = capture_sizes(b.model_runner)
    wanted = dict(max_context_len=b.req_to_token.shape[1], modes=modes, capture_sizes=sizes, max_bs=max(sizes),
                  backend=DSV4Options(index_topk=b.index_topk, compress_ratios=ratios))
    if b.mtp_enabled:
        wanted["num_draft_tokens"] = b.speculative_num_draft_tokens
    return CompileOptions(**(wanted | overrides))


class DSV4Backend(CompiledModes, _SGLangDSV4):
    """SGLang's DSV4 backend; decode, idle, target verify and draft extend V2 metadata compiled.

    On the shared base (``served.CompiledModes``: set-up, refusals, routing, SGLang's graph-runner hooks,
    the out_graph/in_graph pairing). What is DSV4's own: SGLang's ``DSV4Metadata`` is built *after* the
    compiled in_graph (its FlashMLA and DeepGEMM schedulers run on the metadata and are recorded in the
    same graph), fresh on every eager step, and a replay hands back the object its capture built. Its
    replays stage (SGLang hands DSV4 the live batch's ``out_cache_loc``, not a captured buffer)."""

    spec_name = sglang_name = "dsv4"
    options_from = "attnmeta.integrations.sglang.dsv4_backend.dsv4_options(backend)"

    def __init__(self, model_runner, *args, compiled=None, **kwargs):
        super().__init__(model_runner, *args, **kwargs)
        self.bind_attnmeta(compiled)

    @classmethod
    def from_runner(cls, runner, compiled=None):
        """Built as SGLang builds its DSV4 backend, then bound (``compiled``: an artifact loaded ahead)."""
        return cls(runner, compiled=compiled)

    @property
    def agree(self) -> tuple[str, ...]:
        # the page table's width and the verify rows follow from these (and the sparse buffers from DSV4Options,
        # compared whole)
        return ("max_context_len",) + (("num_draft_tokens",) if self.mtp_enabled else ())

    def bind_attnmeta(self, compiled=None) -> None:
        """Serve the captured modes from ``compiled`` (a ``dsv4`` backend; None: compiled now from
        ``dsv4_options(self)``) over this backend's request table and full->SWA slot map. Refuses what the
        spec does not plan, and options that do not match SGLang's, naming each."""
        pools = {"full_to_swa": self.token_to_kv_pool.full_to_swa_index_mapping.detach()}
        self._attach(compiled, dsv4_options(self), self.req_to_token, self.device, **pools)
        self._captured: dict[tuple, object] = {}  # (mode, bs) -> the DSV4Metadata its graph recorded

    def unserved(self) -> list[str]:
        return unserved(self)

    def _topk_v2(self) -> bool:
        backend = getattr(self, "dsa_topk_backend", None)
        return bool(backend is not None and backend.should_use_topk_v2())

    def _build(self):
        v = self._view
        return forward_metadata(self.attnmeta.forward_metadata, v.forward_mode, index_topk=self.index_topk,
                                ratios=self.attnmeta.compiled.options.of(DSV4Options).compress_ratios,
                                use_topk_v2=self._topk_v2())

    def get_cuda_graph_seq_len_fill_value(self):
        return 1  # SGLang's DSV4 fill; attnmeta pads the rows it stages itself, whatever the engine fills

    # --- what the base asks of a kind ---
    def _before_staging(self, v: BatchView, in_capture: bool) -> None:
        """In draft extend, SGLang runs ``max_num_tokens // max_bs`` query rows per request and the spec
        plans ``num_draft_tokens``: different counts would misplace every row."""
        have = getattr(self, "draft_extend_num_tokens_per_req", None)
        want = self.attnmeta.compiled.options.num_draft_tokens
        if v.forward_mode.is_draft_extend() and have is not None and have != want:
            raise OptionsError(f"SGLang's draft extend runs {have} rows per request (max_num_tokens // max_bs) but "
                               f"the dsv4 backend was compiled with num_draft_tokens={want}; compile with "
                               f"num_draft_tokens={have}")

    def _shape(self, m, v: BatchView):
        return None  # built after in_graph (below), not over the bound fields alone

    def _publish(self, shaped) -> None:
        pass  # out_graph publishes the captured object (below); an eager step the one it builds

    def _replay_requires(self, v: BatchView) -> tuple | None:
        return None  # every replay stages out_cache_loc

    # --- the contract ---
    def init_forward_metadata(self, forward_batch) -> None:
        if not self._serves(forward_batch):
            return super().init_forward_metadata(forward_batch)
        v = self._view.fill(forward_batch)
        self._before_staging(v, False)
        self.attnmeta.init_forward_metadata(v)
        self._ours = forward_batch
        self.forward_metadata = self._build()  # fresh: FlashMLA's scheduler state is per step eagerly

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        if self._ours is None:  # SGLang's own served it
            return
        v = self._view
        if in_capture:  # SGLang's warmup hook restores a raw metadata its own capture left; there is none
            self._current_capture_raw = None
            return
        key = (v.forward_mode, v.batch_size)  # a replay: the metadata object its graph recorded, same buffers
        if key not in self._captured:
            raise ContractError(f"no graph captured {v.forward_mode.name} at batch size {v.batch_size} through "
                                "this backend; capture it (init_forward_metadata_in_graph inside the capture) "
                                "before replaying it")
        self.forward_metadata = self._captured[key]

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        super().init_forward_metadata_in_graph(forward_batch)
        if self._ours is not None:  # in a capture (and its warm-ups): the object the graph records
            v = self._view
            self.forward_metadata = self._captured[(v.forward_mode, v.batch_size)] = self._build()
