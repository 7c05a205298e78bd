"""attnmeta.compiler: specs in, per-(mode, bs) plans out."""

from .compile import CompiledBackend, compile_backend
from .modes import ForwardMode
from .options import CompileOptions, OptionsError
from .passes.check_split import RULES, SplitError, Violation
from .passes.check_split import check_split_graph as check_split
from .pipeline import GENERIC_PASSES, PER_BS_PASSES, PassError
from .spec import BackendSpec

__all__ = [
    "GENERIC_PASSES", "PER_BS_PASSES", "RULES", "BackendSpec", "CompileOptions", "CompiledBackend",
    "ForwardMode", "OptionsError", "PassError", "SplitError", "Violation", "check_split", "compile_backend",
]
