"""BackendSpec (what a backend declares once) and the registry that finds specs by name.

The compiler knows no backend. Specs reach it three ways: ``register_backend(spec)``; packages
that declare an ``attnmeta.specs`` entry point (a ``name -> BackendSpec`` mapping, as
attnmeta's own backends package does); and references to a user's code, ``pkg.module:SPEC`` or
``path/to/mine.py:SPEC``. The layers above plug into this one; it never imports them.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points

import attrs

from .ir import Graph
from .ir.builder import SpecError, caller_origin
from .ir.errors import InternalError, OptionsError, UnknownName, UserError
from .modes import ForwardMode
from .options import CompileOptions


@attrs.frozen
class BackendSpec:
    name: str
    build: Callable[[ForwardMode, CompileOptions], Graph]  # one generic graph per graph-key mode
    modes: tuple[ForwardMode, ...]  # modes the spec supports
    doc: str = ""
    # Columns a step of this mode reads past seq_lens (verify drafts, a multi-step drafter's slots);
    # specs declare seq_lens' bound from it (L - headroom), and the runtime refuses longer sequences.
    headroom: Callable[[ForwardMode, CompileOptions], int] = lambda mode, options: 0
    # The page sizes its kernels serve (empty: any); compile_backend refuses others by name.
    page_sizes: tuple[int, ...] = ()
    # Whether it plans sliding-window layers (CompileOptions.sliding_window, window_pool): a spec that does not is
    # refused a window by name, so an artifact never looks windowed while it plans the full layers only.
    windows: bool = False
    # The planners its host_calls name, as stand-ins a backend gets unless the caller passes its own:
    # target -> a zero-argument factory (a fresh planner per instantiated backend).
    planners: Mapping[str, Callable[[], object]] = attrs.field(factory=dict, eq=False)
    # The frozen attrs class of its own options (CompileOptions.backend; the spec reads options.of(it)), or None
    options_type: type | None = None
    # Its own check of the options against what it serves, after the generic ones (raises OptionsError naming the
    # option and the fix): the compiler core names no backend's option
    check: Callable[[CompileOptions], None] = attrs.field(default=lambda options: None, eq=False)

    def __attrs_post_init__(self) -> None:
        """A spec's declaration is checked where it is written (its module's line), not when a mode is built
        deep inside the compiler: ``modes=("decode",)`` was an AttributeError traceback at compile."""
        at = caller_origin(os.path.dirname(os.path.abspath(__file__)))
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\: \t\n"):
            raise SpecError(f"{at}: a BackendSpec's name is a word that names its dumps' folder (e.g. 'mine'), "
                            f"got {self.name!r}")
        if not callable(self.build):
            raise SpecError(f"{at}: BackendSpec {self.name!r}: build must be a function (mode, options) -> Graph, "
                            f"got {type(self.build).__name__}")
        modes = self.modes if isinstance(self.modes, tuple | list) else (self.modes,)
        bad = [m for m in modes if not isinstance(m, ForwardMode)]
        if bad or not modes:
            raise SpecError(f"{at}: BackendSpec {self.name!r}: modes must be a non-empty tuple of ForwardMode "
                            f"members (from attnmeta.compiler import ForwardMode; e.g. (ForwardMode.DECODE,)), got "
                            f"{self.modes!r}; the modes: {', '.join(m.name for m in ForwardMode)}")
        object.__setattr__(self, "modes", tuple(modes))


_REGISTERED: dict[str, BackendSpec] = {}
GROUP = "attnmeta.specs"


def register_backend(spec: BackendSpec, replace: bool = False) -> BackendSpec:
    """Make ``spec`` known by its name (``compile_backend("mine")``, ``attnmeta compile mine``)."""
    if not isinstance(spec, BackendSpec):
        raise UnknownName(f"register_backend takes a BackendSpec, got {type(spec).__name__}")
    if not replace and spec.name in _REGISTERED and _REGISTERED[spec.name] is not spec:
        raise UnknownName(f"a backend named {spec.name!r} is registered already; pass replace=True to override it")
    _REGISTERED[spec.name] = spec
    return spec


@functools.cache
def _installed() -> dict[str, BackendSpec]:
    """Specs of every installed package that declares the entry point group (loaded once)."""
    out: dict[str, BackendSpec] = {}
    for ep in entry_points(group=GROUP):
        specs = ep.load()
        for name, spec in (specs() if callable(specs) else specs).items():
            out.setdefault(name, spec)
    return out


def list_backends() -> list[str]:
    return sorted({**_installed(), **_REGISTERED})


def windowed() -> list[str]:
    """The known backends that plan sliding-window layers."""
    return [n for n in list_backends() if get_spec(n).windows]


def backend_options(ref: str | BackendSpec, **given):
    """The backend's own options (its ``options_type``) with the fields ``given`` (the rest its defaults), or
    None when it has none and nothing is given; a field its options do not have is an ``OptionsError``
    naming it and the ones they do (a flag such as --index-topk given for another backend)."""
    spec = get_spec(ref)
    cls = spec.options_type
    fields = {f.name for f in attrs.fields(cls)} if cls is not None else set()
    stray = sorted(set(given) - fields)
    if stray:
        have = f"its options ({cls.__name__}) are {sorted(fields)}" if cls is not None else \
            "it has no options of its own"
        raise OptionsError(f"{', '.join('--' + k.replace('_', '-') for k in stray)}: not an option of backend "
                           f"{spec.name!r}; {have}")
    return cls(**given) if cls is not None else None


def get_spec(ref: str | BackendSpec) -> BackendSpec:
    """A spec by name, or from a user's code: ``pkg.module:SPEC`` or ``path/to/mine.py:SPEC``."""
    if isinstance(ref, BackendSpec):
        return ref
    if ref in _REGISTERED:
        return _REGISTERED[ref]
    if ":" in ref:
        return _load(ref)
    if ref.endswith(".py") and os.path.isfile(ref):
        names = _specs_in(_module(ref, ref))
        raise UnknownName(f"{ref!r} is a spec file: name the spec in it, e.g. {ref}:{names[0] if names else 'SPEC'}"
                          f" (its BackendSpecs: {', '.join(names) or 'none found'})")
    found = _installed().get(ref)
    if found is None:
        close = difflib.get_close_matches(ref, list_backends(), n=1)
        raise UnknownName(f"unknown backend {ref!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                          f"available: {list_backends()} (or give a spec in your code "
                          "as pkg.module:SPEC or path/to/file.py:SPEC)")
    return found


def _module(where: str, ref: str):
    if not where:
        raise UnknownName(f"{ref!r} names no module or file before the ':'; give pkg.module:SPEC or "
                          "path/to/file.py:SPEC")
    try:
        if where.endswith(".py") or os.sep in where or os.path.isfile(where):
            if not os.path.exists(where):
                raise UnknownName(f"no spec file {where!r} (from {ref!r}); the path is read from the current "
                                  f"directory, {os.getcwd()!r}")
            if not where.endswith(".py"):
                raise UnknownName(f"{where!r} (from {ref!r}) is not a Python file: a spec lives in a .py file "
                                  "(path/to/file.py:SPEC) or an importable module (pkg.module:SPEC)")
            mod_name = f"attnmeta_user_{abs(hash(os.path.abspath(where)))}"
            spec = importlib.util.spec_from_file_location(mod_name, where)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        return importlib.import_module(where)
    except SyntaxError as e:
        raise SpecError(f"{e.filename}:{e.lineno}: a syntax error in the spec's code ({e.msg}), importing "
                        f"{where!r} for spec {ref!r}") from None
    except ImportError as e:
        raise UnknownName(f"cannot import {where!r} for spec {ref!r}: {e}") from None
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's module raised at import: say where, in one line
        raise SpecError(f"{user_line(e)}: importing {where!r} for spec {ref!r} raised {type(e).__name__}: {e}") \
            from None


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # attnmeta's own files


def user_line(e: BaseException) -> str:
    """``file:line`` of the deepest frame of ``e``'s traceback outside attnmeta (the user's code), or
    ``?`` when every frame is attnmeta's."""
    tb, where = e.__traceback__, "?"
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if not os.path.abspath(f).startswith(_PACKAGE + os.sep) and not f.startswith("<frozen"):
            where = f"{f}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def build_graph(spec: BackendSpec, mode: ForwardMode, options: CompileOptions) -> Graph:
    """``spec.build(mode, options)``; an exception raised by a user's builder is a ``SpecError`` naming its
    file and line (one line on the command line), one raised by attnmeta's own specs stays what it is."""
    try:
        g = spec.build(mode, options)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001
        where = user_line(e)
        if where == "?":
            raise
        raise SpecError(f"{where}: the builder of spec {spec.name!r} ({mode.name.lower()}) raised "
                        f"{type(e).__name__}: {e}") from e
    if not isinstance(g, Graph):
        raise SpecError(f"the builder of spec {spec.name!r} ({mode.name.lower()}) returned {type(g).__name__}, not a "
                        "graph: end it with `return b.build()`")
    return g


def _specs_in(module) -> list[str]:
    return sorted(k for k, v in vars(module).items() if isinstance(v, BackendSpec))


def _load(ref: str) -> BackendSpec:
    where, _, attr = ref.rpartition(":")
    module = _module(where, ref)
    obj = getattr(module, attr, None)
    if callable(obj) and not isinstance(obj, BackendSpec) and _no_arguments(obj):
        try:
            obj = obj()  # a factory of a spec
        except Exception as e:  # noqa: BLE001 - the user's factory: one line naming it
            raise SpecError(f"{user_line(e)}: {ref!r}, called as a spec factory, raised {type(e).__name__}: {e}") \
                from None
    if not isinstance(obj, BackendSpec):
        names = _specs_in(module)
        close = difflib.get_close_matches(attr, names, n=1)
        what = "a function" if callable(obj) else type(obj).__name__
        hint = " that needs arguments: name a BackendSpec, or a function that makes one from none" if callable(obj) \
            else ""
        raise UnknownName(f"{ref!r} is not a BackendSpec (got {what}{hint})"
                          f"{f'; did you mean {where}:{close[0]}?' if close else ''}; the BackendSpecs in "
                          f"{where}: {', '.join(names) or 'none'}")
    return obj


def _no_arguments(fn) -> bool:
    """Whether ``fn`` can be called with none (a spec factory; a builder takes mode and options)."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in sig.parameters.values())


def load_plugin(group: str, name: str):
    """The object an installed package registers under entry point ``group``/``name`` (the
    runtime's ``instantiate`` as ``attnmeta.instantiate``/``default``)."""
    for ep in entry_points(group=group, name=name):
        return ep.load()
    raise InternalError(f"no {group}:{name} entry point: attnmeta is not installed (pip install -e .)")
