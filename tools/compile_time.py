"""Compile time of every backend at the default capture sizes (max_bs 256: 36 sizes), one backend
after another in this process; the DESIGN target is under 2 s for all of them.

    python tools/compile_time.py              # every mode each backend supports
    python tools/compile_time.py --decode     # decode (and idle, which shares its plans) only
"""

import argparse
import time

from attnmeta.backends import get_spec, list_backends
from attnmeta.compiler import CompileOptions, compile_backend


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--decode", action="store_true", help="decode plans only")
    a = p.parse_args()
    rows, t0 = [], time.perf_counter()
    for name in list_backends():
        modes = ("decode",) if a.decode else tuple(m.name.lower() for m in get_spec(name).modes)
        t = time.perf_counter()
        cb = compile_backend(name, CompileOptions(max_bs=256, page_size=256 if name == "dsv4" else 1, modes=modes))
        rows.append((name, len(cb.plans), time.perf_counter() - t))
    total = time.perf_counter() - t0
    print("| backend | plans | seconds |\n|---|---|---|")
    for name, plans, s in rows:
        print(f"| {name} | {plans} | {s:.2f} |")
    print(f"| all | {sum(r[1] for r in rows)} | {total:.2f} |")


if __name__ == "__main__":
    main()
