"""The metadata IR: types, op table, graph, builder, text form, verifier, interpreter."""

from .builder import SpecBuilder, SpecError, V
from .graph import Buffer, Graph, Input, Kind, Node, Output, Role, Space, Use
from .interp import eval_graph, valid_prefix
from .ops import OPS, Op, OpInfo, ShapeError
from .parser import ParseError, parse
from .printer import print_graph
from .types import SYMBOLS, DType, Dynamic, Placement, Region, TensorType, dim
from .verify import VerifyError, verify

__all__ = [
    "OPS", "SYMBOLS", "Buffer", "DType", "Dynamic", "Graph", "Input", "Kind", "Node", "Op", "OpInfo", "Output",
    "ParseError", "Placement", "Region", "Role", "ShapeError", "Space", "SpecBuilder", "SpecError", "TensorType",
    "Use", "V", "VerifyError", "dim", "eval_graph", "parse", "print_graph", "valid_prefix", "verify",
]
