"""attnmeta.sim: the demo engine that drives compiled backends the way a serving engine does: a
serving simulation (request pool, KV slots, a changing batch), models whose attention reads the
metadata, two reference attentions, and the graph runners (full, piecewise, drafter). Tests,
demos and benchmarks run on it; an engine of your own replaces it."""

from .attention import decode_attention_loop, paged_decode_attention
from .models import DecodeModel, DraftModel, Model
from .runners import DraftRunner, GraphRunner, OutputView, PiecewiseRunner, StaleOutputError

__all__ = ["DecodeModel", "DraftModel", "DraftRunner", "GraphRunner", "Model", "OutputView", "PiecewiseRunner",
           "StaleOutputError", "decode_attention_loop", "paged_decode_attention"]
