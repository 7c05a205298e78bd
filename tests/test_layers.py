"""Imports go one way: compiler.ir <- the compiler's base modules <- passes <- lowering <- the
compiler's front door <- runtime <- backends <- integrations <- app. A test walks every import statement (those
inside functions too) and every importlib call with a literal name, and fails on an import circle
or on a lower layer importing a higher one."""

import ast
import pathlib

import networkx as nx

ROOT = pathlib.Path(__file__).parent.parent
PACKAGES = {"compiler": "attnmeta.compiler", "runtime": "attnmeta.runtime", "backends": "attnmeta.backends",
            "integrations": "attnmeta.integrations", "app": "attnmeta.app"}
LAYERS = [  # (module prefix, layer): the longest matching prefix decides
    ("attnmeta.compiler.ir", 0),
    ("attnmeta.compiler.modes", 1), ("attnmeta.compiler.options", 1),
    ("attnmeta.compiler.passes", 2),
    ("attnmeta.compiler.lowering", 3),
    ("attnmeta.compiler", 4),  # spec registry, instruments, repro, pipeline, compile, the package's front door
    ("attnmeta.runtime", 5),
    ("attnmeta.backends", 6),
    ("attnmeta.integrations", 7),  # engine adapters (SGLang): above the backends they serve
    ("attnmeta.app", 8),
]


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
