"""attnmeta.runtime: the contract, the compiled backend, staging, checks and graphs (the core: no
planner and no engine of its own; the planners live with their backends, attnmeta.backends.<kind>, the demo engine
in attnmeta.sim)."""

from attnmeta.compiler.modes import ForwardMode

from .backend import AttentionBackend
from .compiled import BatchError, CompiledAttentionBackend, StaleBufferError
from .forward import ForwardBatch, ReplayView
from .graphs import CaptureSyncError, CudaGraph, EmulatedGraph, new_graph


def instantiate(compiled, req_to_token, device=None, planners=None, pools=None) -> CompiledAttentionBackend:
    """A compiled backend bound to an engine's pools and device (``CompiledBackend.instantiate``)."""
    import torch

    from attnmeta.compiler import OptionsError

    from .graphs import _device

    if not isinstance(req_to_token, torch.Tensor):
        raise OptionsError(f"req_to_token must be the engine's pool, a 2-D integer torch.Tensor [rows, "
                           f"max_context_len], got {type(req_to_token).__name__}")
    device = None if device is None else _device(device)
    return CompiledAttentionBackend(compiled, req_to_token, device=device, planners=planners, pools=pools)


__all__ = [
    "AttentionBackend", "BatchError", "CaptureSyncError", "CompiledAttentionBackend", "CudaGraph", "EmulatedGraph",
    "ForwardBatch", "ForwardMode", "ReplayView", "StaleBufferError", "instantiate", "new_graph",
]
