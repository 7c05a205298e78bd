"""Compile time of every backend at the default capture sizes (max_bs 256: 36 sizes), one backend
after another in this process; the DESIGN target is under 2 s for all of them. With ``--dumps``,
what default dumps cost: one backend compiled for every size 1..256 and every mode it serves,
without dumps and with them (the generic passes once per mode, the largest size in full), side
by side in one process.

    python tools/compile_time.py              # every mode each backend supports
    python tools/compile_time.py --decode     # decode (and idle, which shares its plans) only
    python tools/compile_time.py --dumps tbo_triton
    python tools/compile_time.py --artifacts      # compile vs loading a saved artifact, per backend
"""

import argparse
import os
import tempfile
import time

from attnmeta.backends import get_spec, list_backends
from attnmeta.compiler import CompileOptions, compile_backend


def page_size(name: str) -> int:
    """DSV4's 256, else the first page size a backend serves (1 where it serves any)."""
    return 256 if name == "dsv4" else (get_spec(name).page_sizes or (1,))[0]


def every_backend(decode: bool) -> None:
    rows, t0 = [], time.perf_counter()
    for name in list_backends():
        modes = ("decode",) if decode else tuple(m.name.lower() for m in get_spec(name).modes)
        t = time.perf_counter()
        cb = compile_backend(name, CompileOptions(max_bs=256, page_size=page_size(name), modes=modes))
        rows.append((name, len(cb.plans), time.perf_counter() - t))
    total = time.perf_counter() - t0
    print("| backend | plans | seconds |\n|---|---|---|")
    for name, plans, s in rows:
        print(f"| {name} | {plans} | {s:.2f} |")
    print(f"| all | {sum(r[1] for r in rows)} | {total:.2f} |")


def dump_cost(name: str, repeat: int) -> None:
    modes = tuple(m.name.lower() for m in get_spec(name).modes if m.name != "EXTEND")
    base = dict(max_bs=256, capture_sizes=tuple(range(1, 257)), modes=modes,
                page_size=256 if "dsv4" in name else 1)
    compile_backend(name, CompileOptions(**base))  # warm imports and caches for both columns
    rows = []
    columns = (("no dumps", None), ("default dumps", ()), ("--dump-bs 1 8 64", (1, 8, 64)),
               ("--dump-bs all", base["capture_sizes"]))
    for label, dump_bs in columns:
        best, files, size = float("inf"), 0, 0
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as d:
                opts = CompileOptions(**base, dump_dir=d if dump_bs is not None else None, dump_bs=dump_bs or ())
                t = time.perf_counter()
                cb = compile_backend(name, opts)
                best = min(best, time.perf_counter() - t)
                walked = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs]
                files, size = len(walked), sum(os.path.getsize(f) for f in walked)
        rows.append((label, len(cb.plans), best, files, size))
    print(f"{name}: modes {', '.join(modes)}; capture sizes 1..256; best of {repeat}")
    print("| compile | plans | seconds | vs no dumps | files | MB |\n|---|---:|---:|---:|---:|---:|")
    for label, plans, s, files, size in rows:
        print(f"| {label} | {plans} | {s:.2f} | {s / rows[0][2]:.2f}x | {files} | {size / 1e6:.2f} |")


def artifact_cost(repeat: int) -> None:
    """Every backend, every mode, default sizes: compiling against loading its saved artifact."""
    from attnmeta.compiler import load_compiled

    rows = []
    for name in list_backends():
        opts = CompileOptions(max_bs=256, page_size=page_size(name),
                              modes=tuple(m.name.lower() for m in get_spec(name).modes))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.attnmeta")
            best_c = best_l = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                cb = compile_backend(name, opts)
                best_c = min(best_c, time.perf_counter() - t)
                cb.save(path)
                t = time.perf_counter()
                load_compiled(path)
                best_l = min(best_l, time.perf_counter() - t)
            rows.append((name, len(cb.plans), best_c, best_l, os.path.getsize(path)))
    print(f"best of {repeat}")
    print("| backend | plans | compile s | load s | compile/load | artifact KB |\n|---|---:|---:|---:|---:|---:|")
    for name, plans, c, lo, size in rows:
        print(f"| {name} | {plans} | {c:.3f} | {lo:.3f} | {c / lo:.1f}x | {size / 1e3:.0f} |")
    c, lo = sum(r[2] for r in rows), sum(r[3] for r in rows)
    print(f"| all | {sum(r[1] for r in rows)} | {c:.2f} | {lo:.2f} | {c / lo:.1f}x | |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--decode", action="store_true", help="decode plans only")
    p.add_argument("--dumps", metavar="BACKEND", help="measure what dumps cost on this backend's compile")
    p.add_argument("--artifacts", action="store_true", help="compile vs load a saved artifact")
    p.add_argument("--repeat", type=int, default=3, help="with --dumps/--artifacts: runs per row, the best is kept")
    a = p.parse_args()
    if a.artifacts:
        artifact_cost(a.repeat)
    elif a.dumps:
        dump_cost(a.dumps, a.repeat)
    else:
        every_backend(a.decode)


if __name__ == "__main__":
    main()
