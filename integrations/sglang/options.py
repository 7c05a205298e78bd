"""CompileOptions from SGLang's server arguments and model config.

Read by attribute name, so SGLang's ``ServerArgs`` (or any object with its field names) works
without SGLang imported. What each option comes from:

=====================  ==========================================================================
max_bs                 ``cuda_graph_max_bs_decode``, else the largest of ``cuda_graph_bs_decode``
capture_sizes          ``cuda_graph_bs_decode`` (attnmeta's default list up to max_bs when unset)
page_size              ``page_size`` (1 when unset)
max_context_len        the model config's ``context_len``, else ``context_length``
modes                  decode and idle; target_verify and draft_extend when ``speculative_algorithm``
num_draft_tokens etc.  ``speculative_num_draft_tokens``, ``speculative_eagle_topk``, ``speculative_num_steps``
num_heads, kv heads    the model config's heads divided by ``tp_size``
sm_count               the current CUDA device's SM count, when there is one
=====================  ==========================================================================
"""

from __future__ import annotations

import torch

from attnmeta.compiler import CompileOptions
from attnmeta.compiler.ir.errors import OptionsError


def _get(obj, name, default=None):
    v = getattr(obj, name, None) if obj is not None else None
    return default if v is None else v


def compile_options(server_args, model_config=None, **overrides) -> CompileOptions:
    """The options SGLang's graph runner will drive a backend with; ``overrides`` win."""
    sizes = tuple(_get(server_args, "cuda_graph_bs_decode", ()))
    opts: dict = {"capture_sizes": sizes, "page_size": _get(server_args, "page_size", 1)}
    max_bs = _get(server_args, "cuda_graph_max_bs_decode", max(sizes, default=None))
    if max_bs is not None:
        opts["max_bs"] = max_bs
    context = _get(model_config, "context_len", _get(server_args, "context_length"))
    if context is None and "max_context_len" not in overrides:
        raise OptionsError("the context length is unknown: pass the model config (its context_len), set "
                           "--context-length, or pass max_context_len=")
    if context is not None:
        opts["max_context_len"] = context
    if _get(server_args, "speculative_algorithm") is not None:
        opts["modes"] = ("decode", "idle", "target_verify", "draft_extend")
        for ours, theirs in (("num_draft_tokens", "speculative_num_draft_tokens"),
                             ("topk", "speculative_eagle_topk"), ("num_steps", "speculative_num_steps")):
            if _get(server_args, theirs) is not None:
                opts[ours] = _get(server_args, theirs)
    tp = _get(server_args, "tp_size", 1)
    if model_config is not None and _get(model_config, "num_attention_heads") is not None:
        opts["num_heads"] = max(model_config.num_attention_heads // tp, 1)
        kv = model_config.get_num_kv_heads(tp) if hasattr(model_config, "get_num_kv_heads") else None
        opts["num_kv_heads"] = kv or _get(model_config, "num_key_value_heads", opts["num_heads"] * tp) // tp or 1
    if torch.cuda.is_available():
        opts["sm_count"] = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    opts.update(overrides)
    return CompileOptions(**opts)
