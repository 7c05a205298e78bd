"""attnmeta.compiler: specs in, per-(mode, bs) plans out.

Names are loaded on first use (PEP 562): ``from attnmeta.compiler import UserError`` costs the error
module alone, so the command line answers ``--help`` and reads dumps without importing torch."""

import importlib as _importlib
import os as _os

from . import logs as _logs
from .ir.errors import AttnmetaError, Diagnostic, InternalError, NotCompiled, OptionsError, UnknownName, UserError

_LAZY = {  # name -> (module, attribute)
    "ArtifactError": (".artifact", "ArtifactError"),
    "CompiledBackend": (".compile", "CompiledBackend"), "compile_backend": (".compile", "compile_backend"),
    "load_compiled": (".compile", "load_compiled"), "ForwardMode": (".modes", "ForwardMode"),
    "CompileOptions": (".options", "CompileOptions"), "RULES": (".passes.check_split", "RULES"),
    "SplitError": (".passes.check_split", "SplitError"), "Violation": (".passes.check_split", "Violation"),
    "check_split": (".passes.check_split", "check_split_graph"), "GENERIC_PASSES": (".pipeline", "GENERIC_PASSES"),
    "PER_BS_PASSES": (".pipeline", "PER_BS_PASSES"), "PassError": (".pipeline", "PassError"),
    "BackendSpec": (".spec", "BackendSpec"), "get_spec": (".spec", "get_spec"),
    "backend_options": (".spec", "backend_options"),
    "list_backends": (".spec", "list_backends"), "register_backend": (".spec", "register_backend"),
}


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(where[0], __name__), where[1])
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


if _os.environ.get("ATTNMETA_LOGS"):  # opt-in only: otherwise the application's logging setup decides
    _logs.configure(strict=False)

__all__ = [
    "GENERIC_PASSES", "PER_BS_PASSES", "RULES", "ArtifactError", "AttnmetaError", "BackendSpec", "CompileOptions",
    "CompiledBackend", "Diagnostic", "ForwardMode", "InternalError", "NotCompiled", "OptionsError", "PassError",
    "SplitError", "UnknownName", "UserError", "Violation", "backend_options", "check_split", "compile_backend",
    "get_spec", "list_backends", "load_compiled", "register_backend",
]
