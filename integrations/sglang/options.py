"""CompileOptions from what SGLang *resolved*, never from its raw flags.

SGLang leaves most flags unset on ``ServerArgs`` and resolves them (model-dependent EAGLE defaults,
capture sizes, the page size) in its resolution pipeline; its backends read the resolved values.
So do these functions:

- ``resolved_options(runner, backend, **kind)``: the options of a backend SGLang has built (the
  registry's path): the capture sizes of SGLang's own ``get_batch_sizes_to_capture``, the request
  table's width as the context (SGLang's ``req_to_token`` is wider than the model's context: the
  headroom for drafts), the runner's page size, the published speculative settings, and the kind's
  own values read off the built backend (heads per attention-TP rank, SM count, split cap);
- ``compile_options(server_args, model_config)``: the same ahead of serving, for an artifact
  (``ATTNMETA_ARTIFACT``), from ``ServerArgs`` through SGLang's resolution (``resolved_view``; it
  runs the pipeline if it has not run, which needs the server's device: ``--device cuda`` on a
  machine without one). The server checks the artifact against what it resolved when it loads it.

=====================  ======================================================================
max_bs                 the largest captured size
capture_sizes          SGLang's resolved decode graph sizes (``cuda_graph_config.decode.bs``)
page_size              resolved ``page_size``
max_context_len        ``req_to_token``'s width (a server: the model's context + headroom)
modes                  decode and idle; target_verify and draft_extend with a speculative algorithm
num_draft_tokens etc.  resolved ``speculative_num_draft_tokens``, ``_eagle_topk``, ``_num_steps``
num_heads, kv heads    the model's, per attention-TP rank (``tp_size / dp / cp``)
=====================  ======================================================================
"""

from __future__ import annotations

import os

from attnmeta.compiler import CompileOptions
from attnmeta.compiler.ir.errors import OptionsError

SPECULATIVE = ("decode", "idle", "target_verify", "draft_extend")


def resolved_options(runner, sglang_backend, **kind) -> CompileOptions:
    """The options SGLang resolved for ``sglang_backend`` (built on ``runner``), with the kind's own values."""
    from sglang.srt.runtime_context import get_spec

    spec, speculative = get_spec(), runner.spec_algorithm.is_speculative()
    sizes = capture_sizes(runner)
    opts = dict(capture_sizes=sizes, max_bs=max(sizes), page_size=runner.page_size or 1,
                max_context_len=runner.req_to_token_pool.req_to_token.shape[1],
                modes=SPECULATIVE if speculative else ("decode", "idle"))
    if speculative:
        opts.update(num_draft_tokens=spec.speculative_num_draft_tokens, topk=spec.speculative_eagle_topk or 1,
                    num_steps=spec.speculative_num_steps)
        # a target verifies and never draft-extends; a draft runner draft-extends and never verifies
        opts["modes"] = ("draft_extend",) if runner.is_draft_worker else ("decode", "idle", "target_verify")
    return CompileOptions(**(opts | kind))


def capture_sizes(runner) -> tuple[int, ...]:
    """The batch sizes SGLang's decode graph runner captures (its own ``get_batch_sizes_to_capture``);
    where it cannot say (no runtime config published in this process), the server's
    ``cuda_graph_bs_decode``, else the request pool's size (every batch eager)."""
    from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

    try:
        return tuple(get_batch_sizes_to_capture(runner)[0])
    except (AttributeError, TypeError, ValueError, AssertionError):
        sizes = getattr(getattr(runner, "server_args", None), "cuda_graph_bs_decode", None)
        return tuple(sizes) if sizes else (runner.req_to_token_pool.size,)


def compile_options(server_args, model_config=None, **overrides) -> CompileOptions:
    """The options a server started with ``server_args`` will check an artifact against, as SGLang
    resolves them; ``overrides`` win. ``model_config`` (SGLang's ``ModelConfig``) gives the heads
    and the context; the context is the model's plus SGLang's request-table headroom (4 slots, and
    the drafts' when speculative)."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.runtime_context import attn_tp_size_of

    if not getattr(server_args, "_raw_input", None):  # not resolved yet: run SGLang's resolution first
        server_args.resolve_once()
    cfg = resolved_view(server_args)
    sizes = tuple(cfg.cuda_graph_config.decode.bs or ())
    opts: dict = {"page_size": cfg.page_size or 1}
    if sizes:
        max_bs = cfg.cuda_graph_config.decode.max_bs or max(sizes)
        opts |= {"capture_sizes": tuple(s for s in sizes if s <= max_bs), "max_bs": max_bs}
    speculative = cfg.speculative_algorithm is not None
    if speculative:
        opts |= {"modes": SPECULATIVE, "num_draft_tokens": cfg.speculative_num_draft_tokens,
                 "topk": cfg.speculative_eagle_topk or 1, "num_steps": cfg.speculative_num_steps}
    context = getattr(model_config, "context_len", None) or cfg.context_length
    if context is None and "max_context_len" not in overrides:
        raise OptionsError("the context length is unknown: pass the model config (SGLang's ModelConfig), set "
                           "--context-length, or pass max_context_len=")
    if context is not None:
        opts["max_context_len"] = context + _headroom(cfg, speculative)
    if model_config is not None:
        tp = attn_tp_size_of(cfg)
        opts |= {"num_heads": max(model_config.num_attention_heads // tp, 1),
                 "num_kv_heads": model_config.get_num_kv_heads(tp)}
    return CompileOptions(**(opts | overrides))


def _headroom(cfg, speculative: bool) -> int:
    """The columns SGLang's ``req_to_token`` has past the model's context: its own function where the
    config is published (it knows the paged drafters' footprint), else its default, 4 plus the drafts."""
    try:
        from sglang.srt.mem_cache.allocation_sizing import get_req_to_token_extra_context_len

        return get_req_to_token_extra_context_len()
    except (ImportError, ValueError):  # no published runtime config in this process
        return 4 + ((cfg.speculative_num_draft_tokens or 0) if speculative else 0)


def partition() -> dict:
    """``ATTNMETA_PLANNER=host|device``: which planner FlashInfer's kinds (MHA and MLA) run per step; unset:
    ``device`` (the partition planned on the GPU where FlashInfer's version allows)."""
    chosen = os.environ.get("ATTNMETA_PLANNER")
    if chosen is None:
        return {}
    if chosen not in ("host", "device"):
        raise OptionsError(f"ATTNMETA_PLANNER={chosen!r}: set it to 'host' (FlashInfer's own planner every step) "
                           "or 'device' (the partition planned on the GPU), or unset it")
    return {"partition": chosen}


def rank_heads(runner) -> tuple[int, int]:
    """Query and KV heads on this attention-TP rank, as SGLang's backends size them."""
    from sglang.srt.runtime_context import get_parallel

    tp, mc = get_parallel().attn_tp_size, runner.model_config
    return mc.num_attention_heads // tp, mc.get_num_kv_heads(tp)


def device_sms(device) -> dict:
    """``sm_count`` of the runner's GPU, for the kernels that size a schedule by it as their library asks the
    device (FlashMLA's ``get_mla_metadata``); off a GPU nothing (the option's default)."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return {}
    return {"sm_count": torch.cuda.get_device_properties(dev).multi_processor_count}


def sliding_window(b, size: int | None = None) -> tuple[dict, dict]:
    """(options, pools) of SGLang backend ``b``'s sliding window as its runner resolved it: the window
    (``sliding_window_size``; 0 without one) and whether the window layers keep their KV in a pool of their own
    (``SWAKVPool``), whose slots are reached through the allocator's full-to-window table (registered on the
    pool before any backend is built). ``size``: the runner's window, for a backend that keeps none of its own."""
    size = getattr(b, "sliding_window_size", None) if size is None else size  # FlashInfer's keeps it on its runner
    w = size if size and size > 0 else 0
    pool = bool(w and b.use_sliding_window_kv_pool)
    return dict(sliding_window=w, window_pool=pool), (
        {"full_to_swa": b.token_to_kv_pool.full_to_swa_index_mapping} if pool else {})
