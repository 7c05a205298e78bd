"""Two builds' replayed steps on one machine in one device call: a reference commit's and this tree's,
each through its own ``tools/bench_sglang.py`` (the harness its table was measured with), in the order
reference, this, this, reference, so a switch of the host's speed regime during the call (the floor and
every timer double with it) weighs on both alike. The question it answers: did a change cost host time?

    python3 tools/bench_ab.py pack deaff6e            # here: .ab/ref.tar.gz (git archive) and .ab/REF
    run(command="bash tools/h200.sh python3 tools/bench_ab.py run --pin auto --kinds triton,flashinfer "
                "--pages 1,16 --iters 60", carry=[".whl", ".sgl", ".ab"])
    python3 tools/bench_ab.py compare DIR             # the table again, from a run's $OUT

Everything after ``run`` goes to both harnesses as it is. Each side is installed (``pip install -e``, no
dependencies) before it runs, and the process says which tree it imported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACK = os.path.join(ROOT, ".ab")
ORDER = ("ref", "this", "this", "ref")
CELL = ("kind", "page", "mode", "bs")


def pack(ref: str) -> int:
    os.makedirs(PACK, exist_ok=True)
    subprocess.run(["git", "archive", "--format=tar.gz", "-o", os.path.join(PACK, "ref.tar.gz"), ref], cwd=ROOT,
                   check=True)
    sha = subprocess.run(["git", "rev-parse", "--short", ref], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    with open(os.path.join(PACK, "REF"), "w") as f:
        f.write(sha + "\n")
    print(f"packed {ref} ({sha}) into .ab/; carry it: carry=[\".whl\", \".sgl\", \".ab\"]")
    return 0


def _install(tree: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."],
                   cwd=tree, check=True, capture_output=True)


def run(bench_args: list[str]) -> int:
    out = os.environ.get("OUT") or "/tmp/attnmeta-ab"
    os.makedirs(out, exist_ok=True)
    tree = {"this": ROOT, "ref": "/tmp/attnmeta-ab-ref"}
    if not os.path.exists(os.path.join(PACK, "ref.tar.gz")):
        raise SystemExit("bench_ab: no .ab/ref.tar.gz: run `python3 tools/bench_ab.py pack REF` here and carry .ab")
    subprocess.run(["rm", "-rf", tree["ref"]], check=True)
    with tarfile.open(os.path.join(PACK, "ref.tar.gz")) as t:
        t.extractall(tree["ref"], filter="data")
    failed = False
    for n, side in enumerate(ORDER):
        _install(tree[side])
        where = subprocess.run([sys.executable, "-c", "import attnmeta.compiler as c; print(c.__file__)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        if not where.startswith(tree[side]):
            raise SystemExit(f"bench_ab: {side} should import from {tree[side]}, imports {where}")
        name = f"{n + 1}-{side}"
        print(f"== {name}: {where}", flush=True)
        with open(os.path.join(out, f"{name}.log"), "w") as log:
            rc = subprocess.run([sys.executable, "tools/bench_sglang.py", *bench_args, "--json",
                                 os.path.join(out, f"{name}.json")], cwd=tree[side], stdout=log,
                                stderr=subprocess.STDOUT).returncode
        if rc:  # 1: a timed step's metadata differed from SGLang's; else the harness failed (its log's end)
            tail = open(os.path.join(out, f"{name}.log")).read().splitlines()[-8:]
            print(f"== {name} exited {rc}:", *tail, sep="\n  ", flush=True)
            failed = True
    _install(ROOT)  # the machine as it was: this tree installed
    print(compare(out))
    return 1 if failed else 0


def compare(folder: str) -> str:
    """Per cell: each side's attnmeta µs and floor µs (mean over its runs), and this minus the reference."""
    runs: dict[str, list[list[dict]]] = {"ref": [], "this": []}
    for n, side in enumerate(ORDER):
        path = os.path.join(folder, f"{n + 1}-{side}.json")
        if os.path.exists(path):
            runs[side].append(json.load(open(path)))
    ref = open(os.path.join(PACK, "REF")).read().strip() if os.path.exists(os.path.join(PACK, "REF")) else "ref"
    cells: dict[tuple, dict[str, list[dict]]] = {}
    for side, docs in runs.items():
        for doc in docs:
            for r in doc:
                cells.setdefault(tuple(r[k] for k in CELL), {"ref": [], "this": []})[side].append(r)
    heads = []  # each run's first line: torch, the device (or "CPU smoke run"), the pinning
    for n, side in enumerate(ORDER):
        log = os.path.join(folder, f"{n + 1}-{side}.log")
        if os.path.exists(log):
            heads.append(f"{n + 1}-{side}: " + (open(log).readline().strip() or "(empty log)"))
    lines = [*heads,
             f"runs: {len(runs['ref'])} of the reference ({ref}), {len(runs['this'])} of this tree; µs, mean over runs",
             "| kind | page | mode | bs | ref attnmeta | this attnmeta | this - ref | ref floor | this floor "
             "| ref over floor | this over floor | equal steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, got in cells.items():
        if not got["ref"] or not got["this"]:
            lines.append(f"| {' | '.join(map(str, key))} | | | measured on one side only | | | | | |")
            continue
        m = {s: {f: statistics.mean(r[f] for r in got[s]) for f in ("attnmeta_us", "floor_us", "over_us")}
             for s in got}
        eq = sum(r["equal"] for s in got for r in got[s]), sum(r["steps"] for s in got for r in got[s])
        lines.append(f"| {' | '.join(map(str, key))} | {m['ref']['attnmeta_us']:.1f} | {m['this']['attnmeta_us']:.1f} "
                     f"| {m['this']['attnmeta_us'] - m['ref']['attnmeta_us']:+.1f} | {m['ref']['floor_us']:.1f} "
                     f"| {m['this']['floor_us']:.1f} | {m['ref']['over_us']:+.1f} | {m['this']['over_us']:+.1f} "
                     f"| {eq[0]}/{eq[1]} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return run(argv[1:])
    p = argparse.ArgumentParser(prog="tools/bench_ab.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("pack").add_argument("ref", help="a commit, tag or branch of this repository")
    sub.add_parser("compare").add_argument("folder", help="where a run wrote its JSON files (its $OUT)")
    sub.add_parser("run", help="on the GPU: the rest of the line goes to both bench_sglang.py runs")
    a = p.parse_args(argv)
    if a.cmd == "pack":
        return pack(a.ref)
    print(compare(a.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
