"""The metadata IR: types, op table, graph, builder, text form, verifier, interpreter."""

from .builder import SpecBuilder, SpecError, V
from .graph import Graph, Input, Node, Output, Role
from .interp import eval_graph, valid_prefix
from .ops import OPS, Op, OpInfo, ShapeError
from .parser import ParseError, parse
from .printer import print_graph
from .types import SYMBOLS, DType, Dynamic, Placement, Region, TensorType, dim
from .verify import VerifyError, verify

__all__ = [
    "OPS", "SYMBOLS", "DType", "Dynamic", "Graph", "Input", "Node", "Op", "OpInfo", "Output", "ParseError",
    "Placement", "Region", "Role", "ShapeError", "SpecBuilder", "SpecError", "TensorType", "V", "VerifyError",
    "dim", "eval_graph", "parse", "print_graph", "valid_prefix", "verify",
]
