"""attnmeta.compiler: specs in, per-(mode, bs) plans out."""

import os as _os

from . import logs as _logs
from .artifact import ArtifactError
from .compile import CompiledBackend, compile_backend, load_compiled
from .ir.errors import AttnmetaError, Diagnostic, InternalError, OptionsError, UnknownName, UserError
from .modes import ForwardMode
from .options import CompileOptions
from .passes.check_split import RULES, SplitError, Violation
from .passes.check_split import check_split_graph as check_split
from .pipeline import GENERIC_PASSES, PER_BS_PASSES, PassError
from .spec import BackendSpec, get_spec, list_backends, register_backend

if _os.environ.get("ATTNMETA_LOGS"):  # opt-in only: otherwise the application's logging setup decides
    _logs.configure(strict=False)

__all__ = [
    "GENERIC_PASSES", "PER_BS_PASSES", "RULES", "ArtifactError", "AttnmetaError", "BackendSpec", "CompileOptions",
    "CompiledBackend", "Diagnostic", "ForwardMode", "InternalError", "OptionsError", "PassError", "SplitError",
    "UnknownName", "UserError", "Violation", "check_split", "compile_backend", "get_spec", "list_backends",
    "load_compiled", "register_backend",
]
