"""The ``attnmeta`` command line: compile, inspect, demo."""

from __future__ import annotations

import argparse
import os
import sys

from attnmeta.compiler import CompileOptions, InternalError, OptionsError, UserError, compile_backend, list_backends


def writable_dir(d: str) -> str:
    """``d`` exists (or is made) and can be written; otherwise the error says which and why."""
    try:
        os.makedirs(d, exist_ok=True)
        probe = os.path.join(d, f".attnmeta-write-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise OptionsError(f"dump directory {d!r} is not writable ({e.strerror}); pick another --dump-dir") from None
    return d


def cmd_compile(a) -> int:
    dump = a.dump_dir or os.environ.get("ATTNMETA_DUMP_DIR")
    opts = CompileOptions(max_bs=a.max_bs, page_size=a.page_size, max_context_len=a.max_context_len,
                          num_steps=a.num_steps, topk=a.topk, num_draft_tokens=a.num_draft_tokens,
                          modes=a.modes, capture_sizes=a.capture_sizes or (),
                          dump_dir=writable_dir(dump) if dump else None, force=a.force,
                          disabled_passes=tuple(a.disable_pass or ()), verify_each=a.verify_each)
    from attnmeta.compiler.instruments import PrintAfterAll

    inst = [PrintAfterAll(sys.stderr, only_changes=a.print_after_change)] if a.print_after_all or \
        a.print_after_change else []
    cb = compile_backend(a.backend, opts, instruments=inst)
    print(f"compiled {a.backend}: {len(cb.plans)} plans ({len(opts.sizes)} capture sizes x "
          f"{len(cb.generic)} graph modes) in {cb.seconds:.3f} s")
    cols = ["mode", "bs", "out_graph", "in_graph", "kernels", "host_ops", "bytes_per_step"]
    rows = cb.summary()
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print("  ".join(c.rjust(width[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r[c]).rjust(width[c]) for c in cols))
    print("pass time (s): " + ", ".join(f"{k} {v:.3f}" for k, v in cb.timing.seconds.items()))
    if opts.dump_dir:
        print(f"dumps: {os.path.join(opts.dump_dir, a.backend)}/<mode>-bs<N>/NN-<pass>.ir")
    return 0


def cmd_inspect(a) -> int:
    root = a.dir
    if not os.path.isdir(root):
        print(f"no dump directory {root!r}; create one with: attnmeta compile BACKEND --dump-dir {root}",
              file=sys.stderr)
        return 2
    for dirpath, _, files in sorted(os.walk(root)):
        irs = sorted(f for f in files if f.endswith(".ir"))
        if irs:
            print(f"{os.path.relpath(dirpath, root)}:")
            for f in sorted(files):
                print(f"  {f}")
            if a.diff:
                import difflib

                for x, y in zip(irs, irs[1:], strict=False):
                    with open(os.path.join(dirpath, x)) as fx, open(os.path.join(dirpath, y)) as fy:
                        d = list(difflib.unified_diff(fx.readlines(), fy.readlines(), x, y, n=0))
                    print("".join(d) if d else f"  {y}: no change from {x}\n", end="")
    return 0


def cmd_demo(a) -> int:
    import torch

    from .demo import format_result, run_demo

    if a.device and a.device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionsError(f"--device {a.device}: this machine has no CUDA device; leave --device out (CPU here)")
    for name in ("steps", "max_bs", "num_steps", "topk"):
        if getattr(a, name) < 1:
            raise OptionsError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    too_big = [s for s in a.capture_sizes or () if not 1 <= s <= a.max_bs]
    if too_big:
        raise OptionsError(f"--capture-sizes {too_big} are outside 1..--max-bs={a.max_bs}; raise --max-bs or drop them")
    kw = {"capture_sizes": tuple(a.capture_sizes)} if a.capture_sizes else {}
    r = run_demo(a.backend, steps=a.steps, max_bs=a.max_bs, device=a.device, seed=a.seed, num_steps=a.num_steps,
                 topk=a.topk, **kw)
    print(format_result(r))
    for f in r.failures[:5]:
        print(f"  mismatch at step {f[0]} (bs {f[1]}): {', '.join(f[2])}")
    ok = r.mismatches == 0 and r.max_abs_diff < 1e-5
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def cmd_bench(a) -> int:
    import torch

    from .bench import format_table, run_bench

    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dev == "cpu":
        from attnmeta.compiler.lowering.triton_kernels import set_cpu_kernels

        set_cpu_kernels("torch")  # the Triton interpreter would swamp host time
        print("note: on a CPU, 'device' work runs on the host too; only GPU numbers show host overhead alone")
    rows = run_bench(a.backend, sizes=tuple(a.sizes), iters=a.iters, max_context_len=a.max_context_len, device=dev)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(format_table(rows, name))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attnmeta", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile", help="compile a backend spec ahead of serving")
    c.add_argument("backend", help=f"a backend ({', '.join(list_backends())}), or your spec as pkg.module:SPEC "
                                   "or path/to/file.py:SPEC")
    c.add_argument("--modes", nargs="+", default=["decode", "idle"])
    c.add_argument("--max-bs", type=int, default=256)
    c.add_argument("--capture-sizes", type=int, nargs="+")
    c.add_argument("--page-size", type=int, default=1)
    c.add_argument("--max-context-len", type=int, default=4096)
    c.add_argument("--num-steps", type=int, default=3, help="draft steps per round (multistep_*)")
    c.add_argument("--topk", type=int, default=1, help="draft branches per request (multistep_*)")
    c.add_argument("--num-draft-tokens", type=int, default=4, help="tokens verified per request (target_verify)")
    c.add_argument("--dump-dir", help="write NN-<pass>.ir/.dot and lowered code per (mode, bs); "
                                      "also ATTNMETA_DUMP_DIR")
    c.add_argument("--print-after-all", action="store_true", help="print the IR after every pass (stderr)")
    c.add_argument("--print-after-change", action="store_true", help="print the IR after passes that changed it")
    c.add_argument("--disable-pass", nargs="+", metavar="PASS", help="skip passes by name, to bisect")
    c.add_argument("--force", action="store_true", help="allow --disable-pass to switch off a safety pass "
                                                        "(verify, check-split)")
    c.add_argument("--verify-each", action="store_true", help="run the verifier after every pass")
    c.set_defaults(fn=cmd_compile)
    i = sub.add_parser("inspect", help="list pass dumps and what each pass changed")
    i.add_argument("dir")
    i.add_argument("--diff", action="store_true", help="show the diff between consecutive passes")
    i.set_defaults(fn=cmd_inspect)
    d = sub.add_parser("demo", help="serving loop on the default backend, checked against eager every step")
    d.add_argument("--backend", default="flashinfer", choices=list_backends(),
                   help="the backend whose metadata the loop's attention reads; multistep_* and "
                        "flashattention_draft run the EAGLE drafter's steps")
    d.add_argument("--num-steps", type=int, default=3, help="draft steps per round (multistep_*)")
    d.add_argument("--topk", type=int, default=1, help="draft branches per request (multistep_*)")
    d.add_argument("--steps", type=int, default=120)
    d.add_argument("--max-bs", type=int, default=48)
    d.add_argument("--capture-sizes", type=int, nargs="+", help="default: 1 2 4 8 16 24 32 (up to --max-bs)")
    d.add_argument("--device", default=None)
    d.add_argument("--seed", type=int, default=0)
    d.set_defaults(fn=cmd_demo)
    be = sub.add_parser("bench", help="host time per step: compiled replay vs the floor and the eager twin")
    be.add_argument("--backend", default="flashinfer", choices=["flashinfer", "flashattention", "triton"])
    be.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    be.add_argument("--iters", type=int, default=300)
    be.add_argument("--max-context-len", type=int, default=4096)
    be.add_argument("--device", default=None)
    be.set_defaults(fn=cmd_bench)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except BrokenPipeError:  # `attnmeta compile ... | head`: the reader left, nothing is wrong
        sys.stderr.close()
        return 0
    except UserError as e:  # what the user gave is wrong: one line, what and how to fix it
        print(f"attnmeta: {e}", file=sys.stderr)
        return 2
    except InternalError as e:
        print(f"attnmeta: internal error (a bug in attnmeta, not in your spec; please report it with the repro "
              f"bundle if one is named): {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
