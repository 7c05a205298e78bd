"""``attnmeta inspect``: read a compile's dumps. The pass table first; diffs on request, for one
mode and size (the generic passes have no size); an HTML report (report.py)."""

from __future__ import annotations

import difflib
import json
import os

from attnmeta.compiler import OptionsError, UserError

from .table import table


def find_run(path: str) -> str:
    """The run folder ``path`` names: itself, its ``latest`` (a backend folder), or the single
    backend's ``latest`` (a dump root)."""
    if not os.path.isdir(path):
        raise OptionsError(f"no dump directory {path!r}; create one with: attnmeta compile BACKEND --dump-dir {path}")
    if os.path.exists(os.path.join(path, "passes.json")) or os.path.basename(os.path.normpath(path)).startswith("run-"):
        return path  # a run folder (one without passes.json says so when read)
    if os.path.isdir(os.path.join(path, "latest")):
        return os.path.realpath(os.path.join(path, "latest"))
    backends = [d for d in sorted(os.listdir(path)) if os.path.isdir(os.path.join(path, d, "latest"))]
    if len(backends) == 1:
        return os.path.realpath(os.path.join(path, backends[0], "latest"))
    if backends:
        raise OptionsError(f"{path!r} holds dumps of {backends}; name one: attnmeta inspect {path}/{backends[0]}")
    raise OptionsError(f"{path!r} holds no attnmeta dumps (no passes.json, no latest run)")


def runs(run: str) -> list[str]:
    """Every run folder beside ``run`` (its backend's), oldest first."""
    parent = os.path.dirname(os.path.realpath(run))
    return sorted(os.path.join(parent, d) for d in os.listdir(parent) if d.startswith("run-")
                  and os.path.isdir(os.path.join(parent, d)))


def run_list(run: str) -> str:
    """A line per run: its folder, status (complete, or the pass that failed) and pass rows."""
    rows = []
    for r in runs(run):
        try:
            data = load(r)
            status = data.get("status", "complete")
            rows.append({"run": os.path.basename(r), "status": status, "passes": len(data["passes"]),
                         "latest": "*" if os.path.realpath(r) == os.path.realpath(run) else ""})
        except UserError:
            rows.append({"run": os.path.basename(r), "status": "unreadable", "passes": 0, "latest": ""})
    return table(rows, ["run", "status", "passes", "latest"], title=os.path.dirname(os.path.realpath(run)))


def prune(run: str, keep: int) -> list[str]:
    """Delete all but the newest ``keep`` runs beside ``run`` (never ``run`` itself); the deleted folders."""
    import shutil

    if keep < 1:
        raise OptionsError(f"--keep must be at least 1, got {keep}")
    old = [r for r in runs(run)[:-keep] if os.path.realpath(r) != os.path.realpath(run)]
    for r in old:
        shutil.rmtree(r)
    return old


def load(run: str) -> dict:
    path = os.path.join(run, "passes.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise OptionsError(f"{run} has no passes.json: that compile ended before writing its dumps (killed?); "
                           "compile again with --dump-dir") from None
    except json.JSONDecodeError as e:
        raise OptionsError(f"{path} is not a pass table ({e}); compile again with --dump-dir") from None


def failure(run: str) -> str:
    """A failed compile's failure, every violation on its own lines (empty for a complete one)."""
    f = load(run).get("failure")
    if not f:
        return ""
    where = f"{f['mode']}" + ("" if f["bs"] is None else f", bs {f['bs']}")
    out = [f"FAILED in pass {f['pass']} ({where}): {f['error']}; its input: {os.path.join(run, f['ir'])}"]
    for v in f["violations"]:
        out.append(f"  [{v['rule']}] %{v['node']} at {v['origin'] or '?'}: {v['message']}\n      fix: {v['fix']}")
    if not f["violations"]:
        out.append(f"  {f['message']}")
    return "\n".join(out)


def check_filters(run: str, mode: str | None, pass_: str | None, diff: bool) -> None:
    """``--mode`` and ``--pass`` name what this run recorded (a name it did not would print an empty table), and a
    diff asks for a pass that writes IR."""
    rows = load(run)["passes"]
    passes = {r["pass"] for r in rows}
    for flag, value, known in (("--mode", mode, {r["mode"] for r in rows}), ("--pass", pass_, passes)):
        if value and value not in known:
            raise OptionsError(f"{flag} {value}: this run recorded none; it has {sorted(known)}")
    if diff and pass_ == "lower":
        raise OptionsError("--pass lower --diff: lower writes code, not IR (NN-lowered.py beside the size's .ir "
                           f"files); read that file, or diff a pass that writes IR: {sorted(passes - {'lower'})}")


def pass_table(run: str, mode: str | None = None, bs: int | None = None, pass_: str | None = None) -> str:
    rows = []
    for r in load(run)["passes"]:
        if (mode and r["mode"] != mode) or (bs is not None and r["bs"] not in (bs, None)) or (
                pass_ and r["pass"] != pass_):
            continue
        nodes = f"{r['nodes_before']} -> {r['nodes_after']}" if r["nodes_before"] is not None else r["nodes_after"]
        rows.append({"pass": r["pass"], "mode": r["mode"], "bs": r["bs"], "changed": r["changed"], "nodes": nodes,
                     "ms": round(r["seconds"] * 1000, 2), "kernels": r["kernels"]})
    data = load(run)
    title = f"run {run} ({data.get('status', 'complete')})"
    return table(rows, ["pass", "mode", "bs", "changed", "nodes", "ms", "kernels"], title=title)


def stages(run: str, mode: str, bs: int | None) -> list[tuple[str, str]]:
    """(file, path) of every .ir of one mode in pipeline order: its generic passes, then one size's."""
    d = os.path.join(run, mode)
    if not os.path.isdir(d):
        raise OptionsError(f"no dumps of mode {mode!r} in {run}; modes: {modes(run)}")
    files = [(f, os.path.join(d, f)) for f in sorted(os.listdir(d)) if f.endswith(".ir")]
    if bs is not None:
        sd = os.path.join(d, f"bs{bs}")
        if not os.path.isdir(sd):
            raise OptionsError(f"no dumps of bs {bs} in {d}; sizes dumped: {sizes(run, mode)} (--dump-bs)")
        files += [(f, os.path.join(sd, f)) for f in sorted(os.listdir(sd)) if f.endswith(".ir")]
    return files


def modes(run: str) -> list[str]:
    return sorted(d for d in os.listdir(run) if os.path.isdir(os.path.join(run, d)))


def sizes(run: str, mode: str) -> list[int]:
    d = os.path.join(run, mode)
    return sorted(int(x[2:]) for x in os.listdir(d) if x.startswith("bs") and os.path.isdir(os.path.join(d, x)))


def diffs(run: str, mode: str, bs: int | None, pass_: str | None = None) -> str:
    """What each pass changed, as unified diffs (only ``pass_`` when given)."""
    out = []
    files = stages(run, mode, bs)
    for (x, px), (y, py) in zip(files, files[1:], strict=False):
        if pass_ and not y.split("-", 1)[1].startswith(pass_ + "."):
            continue
        with open(px) as fx, open(py) as fy:
            a, b = fx.readlines()[1:], fy.readlines()[1:]  # past the header line
        d = list(difflib.unified_diff(a, b, x, y, n=0))
        out.append("".join(d) if d else f"{y}: no change from {x}\n")
    return "".join(out)
