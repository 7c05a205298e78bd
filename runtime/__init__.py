"""attnmeta.runtime: the contract, the compiled backend, graphs and the runner."""

from attnmeta.compiler.modes import ForwardMode

from .attention import DecodeModel, decode_attention_loop, paged_decode_attention
from .backend import AttentionBackend
from .compiled import BatchError, CompiledAttentionBackend, StaleBufferError
from .forward import ForwardBatch, ReplayView
from .graphs import CaptureSyncError, CudaGraph, EmulatedGraph, new_graph
from .runner import GraphRunner, OutputView, StaleOutputError

__all__ = [
    "AttentionBackend", "BatchError", "CaptureSyncError", "CompiledAttentionBackend", "CudaGraph", "DecodeModel",
    "EmulatedGraph", "ForwardBatch", "ForwardMode", "GraphRunner", "OutputView", "ReplayView", "StaleBufferError",
    "StaleOutputError", "decode_attention_loop", "new_graph", "paged_decode_attention",
]
