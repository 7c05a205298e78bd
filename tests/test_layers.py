"""Imports go one way: compiler.ir <- the compiler's base modules <- passes <- lowering <- the
compiler's front door <- runtime <- backends <- integrations, app and sim. Inside backends, each kind is
one folder (its spec, planner and eager twin) that imports no other kind's folder. A test walks
every import statement (those inside functions too) and every importlib call with a literal name,
and fails on an import circle or on a lower layer importing a higher one. The compiler reaches
the layers above only through entry points named for a role: no string in its code (a module it
loads, an import line it writes into a generated script, a folder it hashes) names one."""

import ast
import pathlib
import re

import networkx as nx

ROOT = pathlib.Path(__file__).parent.parent
PACKAGES = {"compiler": "attnmeta.compiler", "runtime": "attnmeta.runtime", "backends": "attnmeta.backends",
            "integrations": "attnmeta.integrations", "app": "attnmeta.app",
            "sim": "attnmeta.sim"}
LAYERS = [  # (module prefix, layer): the longest matching prefix decides
    ("attnmeta.compiler.ir", 0),
    ("attnmeta.compiler.modes", 1), ("attnmeta.compiler.options", 1),
    ("attnmeta.compiler.passes", 2),
    ("attnmeta.compiler.lowering", 3),
    ("attnmeta.compiler", 4),  # spec registry, instruments, repro, pipeline, compile, the package's front door
    ("attnmeta.runtime", 5),  # the core: contract, compiled backend, binding, staging, checks, graphs
    ("attnmeta.backends", 7),  # one folder per kind: its spec, its planner (the runtime's seam) and eager twin
    ("attnmeta.integrations", 8),  # engine adapters (SGLang, vLLM): above the backends they serve
    ("attnmeta.sim", 8),  # the demo engine, beside the engine adapters
    ("attnmeta.app", 9),  # the CLI, demos and benchmarks drive the demo engine
]
HIGHER = [f for f, _ in PACKAGES.items() if f != "compiler"]


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([pkg, *parts])] = f
    return out


def layer(mod: str) -> int:
    return next(lv for p, lv in sorted(LAYERS, key=lambda pl: -len(pl[0])) if mod == p or mod.startswith(p + "."))


def imports(mod: str, path: pathlib.Path, known: set[str]) -> set[str]:
    is_pkg = path.name == "__init__.py"
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            names = subs or [target]  # "from pkg import mod" depends on mod, not on pkg's __init__
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant):
            names = [node.args[0].value]
        for n in names:
            while n and n not in known:  # "pkg.mod.name" -> the module "pkg.mod"
                n = n.rpartition(".")[0]
            if n and n != mod and not mod.startswith(n + "."):  # a package is set up before its modules
                found.add(n)
    return found


def import_graph() -> nx.DiGraph:
    mods = modules()
    g = nx.DiGraph()
    for m, p in mods.items():
        g.add_node(m)
        g.add_edges_from((m, t) for t in imports(m, p, set(mods)))
    return g


def test_no_import_circle():
    cycles = list(nx.simple_cycles(import_graph()))
    assert not cycles, f"import circles: {cycles[:5]}"


def test_no_lower_layer_imports_a_higher_one():
    g = import_graph()
    up = [(a, b) for a, b in g.edges if layer(a) < layer(b)]
    assert not up, "imports from a lower layer to a higher one:\n" + "\n".join(f"  {a} -> {b}" for a, b in up)


def test_the_walk_sees_what_it_should():
    """The walk is not vacuous: it finds the imports a reader sees (relative, absolute, lazy)."""
    g = import_graph()
    assert ("attnmeta.compiler.lowering.fx", "attnmeta.compiler.lowering.binding") in g.edges  # relative
    assert ("attnmeta.runtime.compiled", "attnmeta.compiler.lowering.binding") in g.edges  # absolute
    assert ("attnmeta.app.cli", "attnmeta.app.demo") in g.edges  # inside a function
    assert layer("attnmeta.compiler.ir.ops") == 0 and layer("attnmeta.compiler.compile") == 4


FOLDERS = sorted(p.name for p in (ROOT / "backends").iterdir() if (p / "__init__.py").is_file())


def folder_of(mod: str) -> str | None:
    """The backend folder a module is in (``attnmeta.backends.flashinfer.planner`` -> ``flashinfer``), else None."""
    parts = mod.split(".")
    return parts[2] if parts[:2] == ["attnmeta", "backends"] and len(parts) > 2 and parts[2] in FOLDERS else None


def test_a_backend_folder_imports_no_other_kinds_folder():
    """A kind's folder (spec, planner, twin) reads only itself, the shared backend modules and the layers
    below; the shared modules (common, tbo, multistep, reference, flashinfer_lib) read no kind's folder.
    Only the package's front door (``attnmeta.backends``: SPECS, the twins) gathers them."""
    g = import_graph()
    cross = [(a, b) for a, b in g.edges if folder_of(b) and folder_of(a) != folder_of(b) and a != "attnmeta.backends"
             and a.startswith("attnmeta.backends")]
    assert not cross, "a backend module imports another kind's folder:\n" + "\n".join(f"  {a} -> {b}" for a, b in cross)
    assert len(FOLDERS) >= 7 and ("attnmeta.backends.flashinfer.planner", "attnmeta.backends.flashinfer.device_plan") \
        in g.edges and ("attnmeta.backends.flashinfer_mla.planner", "attnmeta.backends.flashinfer_lib") in g.edges


def string_edges(root: pathlib.Path = ROOT) -> list[str]:
    """Strings in the compiler's code that name a higher layer: a dotted module (``attnmeta.runtime``,
    ``attnmeta.backends.x``), or a source folder as a path part (``"runtime/x"``) or among other
    folders (``("compiler", "backends")``). Docstrings and comments may speak of them; code may not."""
    dotted = re.compile(rf"\battnmeta\.({'|'.join(HIGHER)})\b")
    found = []
    for f in sorted((root / "compiler").rglob("*.py")):
        tree = ast.parse(f.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(
            n, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef) and n.body and isinstance(
            n.body[0], ast.Expr) and isinstance(getattr(n.body[0], "value", None), ast.Constant)}
        folders = set()  # a tuple or list of source folders ("compiler", "backends"): a tree walked by name
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List):
                names = [e for e in node.elts if isinstance(e, ast.Constant) and e.value in PACKAGES]
                folders |= {id(e) for e in names if len(names) > 1 and e.value in HIGHER}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            v = node.value
            path = "/" in v and any(p in HIGHER for p in v.split("/"))
            if dotted.search(v) or path or id(node) in folders:
                found.append((f.relative_to(root), node.lineno, f"{f.relative_to(root)}:{node.lineno}: {v[:80]!r}"))
    return [e for *_, e in sorted(found)]


def test_the_compiler_names_no_higher_layer_in_code():
    edges = string_edges()
    assert not edges, "the compiler names a higher layer in a string:\n" + "\n".join(f"  {e}" for e in edges)


def test_the_string_walk_sees_what_it_should(tmp_path):
    """The string check is not vacuous: it finds the three kinds of edge it is for."""
    bad = tmp_path / "compiler" / "bad.py"
    bad.parent.mkdir()
    bad.write_text('"""Speaks of attnmeta.runtime: allowed."""\nload("attnmeta.runtime", "x")\n'
                   'line = "from attnmeta.backends.reference import y"\nPARTS = ("compiler", "backends")\n')
    assert [e.split(": ", 1)[0] for e in string_edges(tmp_path)] == [
        "compiler/bad.py:2", "compiler/bad.py:3", "compiler/bad.py:4"]
