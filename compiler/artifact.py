"""Compile ahead of serving: a compiled backend saved to one file, loaded without running a pass.

The file (a zip) holds ``manifest.json`` (what it was compiled from, readable with ``unzip -p``)
and the passes' results: each mode's generic graph and each plan's final graph, frozen IR
objects pickled as they are (exact, and about 20x faster to read back than to parse their text
form). Loading reads them and runs lowering alone, no pass. As with ``torch.load``, load only
artifacts you built: unpickling runs code the file names.

The artifact is keyed by a content hash over the spec's source file, the options, the
attnmeta code, and the versions of attnmeta, torch and triton. A file
whose key differs from what this process would compile is refused with the command that
rebuilds it: a stale artifact would serve metadata from a spec or compiler that no longer exists.

Compiled Triton kernels are not in the file. Triton caches them by source in
``TRITON_CACHE_DIR`` (default ``~/.triton/cache``), and a loaded artifact generates the same
sources, so a server that keeps that directory compiles no kernel on its second start.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import pickle
import sys
import time
import zipfile
from importlib.metadata import PackageNotFoundError, version

import attrs

from .ir.errors import UnknownName, UserError
from .options import CompileOptions, backend_json
from .pipeline import lower_stages
from .spec import BackendSpec, get_spec

FORMAT = 1
COMPILER = os.path.dirname(os.path.abspath(__file__))  # the compiler's own source tree


class ArtifactError(UserError):
    """A compiled artifact that cannot be served: missing, unreadable, or stale."""


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def spec_code(spec: BackendSpec) -> str:
    """The source folder of the package the spec is defined in (its helpers live there; a spec file
    of its own, outside a package, is hashed as the spec's source alone)."""
    module = sys.modules.get(spec.build.__module__)
    package = getattr(module, "__package__", None)
    pkg_file = getattr(sys.modules.get(package), "__file__", None) if package else None
    return os.path.dirname(os.path.abspath(pkg_file)) if pkg_file else ""


@functools.cache
def code_hash(*trees: str) -> str:
    """Every Python file of the compiler and of ``trees`` (the spec's package): passes, lowering or a
    spec helper that changed make an artifact stale. The runtime and planners are not hashed: what
    they read of a plan (its Binding) is the compiler's."""
    h = hashlib.sha256()
    for top in (COMPILER, *(t for t in trees if t)):
        for root, _, files in sorted(os.walk(top)):
            for f in sorted(files):
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    h.update(os.path.relpath(path, os.path.dirname(top)).encode())
                    with open(path, "rb") as fh:
                        h.update(fh.read())
    return h.hexdigest()


NOT_PLANS = ("dump_dir", "dump_bs", "dump_modes", "verify_each", "force")  # options no plan depends on


def _options_dict(o: CompileOptions) -> dict:
    """Every option that shapes the plans, as JSON; ``CompileOptions(**d)`` rebuilds them (its
    converters take the lists back)."""
    d = {f.name: getattr(o, f.name) for f in attrs.fields(CompileOptions) if f.name not in NOT_PLANS}
    return {**d, "capture_sizes": list(o.sizes), "modes": [m.name.lower() for m in o.modes],
            "disabled_passes": list(o.disabled_passes), "backend": backend_json(o.backend)}


def key(spec: BackendSpec, options: CompileOptions) -> dict:
    """What an artifact must match to be served: versions, code, the spec's source, the options."""
    import torch
    import triton

    src = inspect.getsourcefile(spec.build)
    with open(src, "rb") as f:
        spec_hash = hashlib.sha256(f.read()).hexdigest()
    parts = {"format": FORMAT, "attnmeta": _version("attnmeta"), "torch": torch.__version__,
             "triton": triton.__version__, "code": code_hash(spec_code(spec)), "spec": spec.name,
             "spec_source": spec_hash,
             "options": _options_dict(options)}
    parts["hash"] = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return parts


def save(compiled, path: str, ref: str | None = None) -> str:
    """Write ``compiled`` to ``path``. ``ref`` is how a later process finds the spec: a registered
    name, ``pkg.module:SPEC`` or ``path/to/file.py:SPEC`` (default: the spec's name)."""
    ref = ref or compiled.ref or compiled.spec.name
    where, colon, attr = ref.rpartition(":")
    if colon and (where.endswith(".py") or os.sep in where):  # a file: found again from any directory
        ref = f"{os.path.abspath(where)}:{attr}"
    manifest = {"key": key(compiled.spec, compiled.options), "ref": ref,
                "plans": sorted([m.name.lower(), bs] for m, bs in compiled.plans)}
    graphs = {"generic": dict(compiled.generic), "finals": {k: p.graph for k, p in compiled.plans.items()}}
    tmp = f"{path}.tmp{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1))
        z.writestr("graphs.pickle", pickle.dumps(graphs, protocol=pickle.HIGHEST_PROTOCOL))
    os.replace(tmp, path)  # a reader never sees half a file
    return path


def read(path: str, spec: BackendSpec | str | None = None):
    """What ``load_compiled`` builds a compiled backend from: (spec, options, stages, ref, seconds),
    the stages lowered in this process; no pass runs. ``spec`` overrides the saved reference."""
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read("manifest.json"))
            saved = manifest["key"]
            blob = z.read("graphs.pickle")
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as e:
        raise ArtifactError(f"cannot read compiled artifact {path!r} ({e}); write one with "
                            "`attnmeta compile BACKEND --out FILE`") from None
    ref = manifest["ref"]
    try:
        spec = get_spec(spec if spec is not None else ref)
    except UnknownName as e:
        raise ArtifactError(f"compiled artifact {path!r} was compiled from spec {ref!r}, which this process cannot "
                            f"find ({e}); install it, or pass it: load_compiled(path, spec=...)") from None
    opts = dict(saved["options"])
    own = opts.pop("backend", None)
    try:
        options = CompileOptions(**opts, backend=None if own is None else spec.options_type(**own))
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"compiled artifact {path!r} holds options {spec.name!r} no longer takes ({e}); "
                            f"rebuild it with `attnmeta compile {ref} --out {path}`") from None
    now = key(spec, options)
    stale = [k for k in ("format", "attnmeta", "torch", "triton", "code", "spec", "spec_source")
             if saved.get(k) != now[k]]
    if stale:
        what = ", ".join(f"{k} {saved.get(k)!r} -> {now[k]!r}" if k not in ("code", "spec_source") else
                         f"{k} changed" for k in stale)
        raise ArtifactError(f"compiled artifact {path!r} is stale ({what}); rebuild it with "
                            f"`attnmeta compile {ref} --out {path}` (same options) before serving")
    t0 = time.perf_counter()
    graphs = pickle.loads(blob)  # noqa: S301  (the user's own artifact; its key matched this process)
    s = lower_stages(graphs["generic"], graphs["finals"], options)
    return spec, options, s, ref, time.perf_counter() - t0
