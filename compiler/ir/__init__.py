"""The metadata IR: types, op table, graph, builder, text form, verifier, interpreter.

Names are loaded on first use (PEP 562), so ``attnmeta.compiler.ir.errors`` imports without torch."""

import importlib as _importlib
import sys as _sys
import types as _types

_FROM = {
    ".builder": ("SpecBuilder", "SpecError", "SpecWarning", "V"),
    ".graph": ("Buffer", "Graph", "Input", "Kind", "Node", "Output", "Role", "Space", "Use"),
    ".interp": ("eval_graph", "valid_prefix"), ".ops": ("OPS", "Op", "OpInfo", "ShapeError"),
    ".parser": ("ParseError", "parse"), ".printer": ("print_graph", "print_graph_or_say_why"),
    ".types": ("SYMBOLS", "DType", "Dynamic", "Placement", "Region", "TensorType", "dim"),
    ".verify": ("VerifyError", "verify"),
}
_LAZY = {name: module for module, names in _FROM.items() for name in names}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(_types.ModuleType):
    """``verify`` names both a submodule and the function this package exports. The import system binds the
    submodule onto the package when it first loads (the builder imports it); the function stays the
    package's ``verify``, as when this package imported it eagerly."""

    @property
    def verify(self):
        return __getattr__("verify")

    @verify.setter
    def verify(self, module) -> None:  # the submodule's binding: the function keeps the name
        pass


_sys.modules[__name__].__class__ = _Package


__all__ = [
    "OPS", "SYMBOLS", "Buffer", "DType", "Dynamic", "Graph", "Input", "Kind", "Node", "Op", "OpInfo", "Output",
    "ParseError", "Placement", "Region", "Role", "ShapeError", "Space", "SpecBuilder", "SpecError", "TensorType",
    "Use", "V", "VerifyError", "dim", "eval_graph", "parse", "print_graph", "print_graph_or_say_why", "valid_prefix",
    "verify",
]
