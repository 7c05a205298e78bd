"""The ``attnmeta`` command line: compile a spec ahead of serving, inspect what the compile did,
run a checked serving loop, measure host overhead.

examples:
  attnmeta compile flashinfer --max-bs 64 --dump-dir dumps --dump-bs 8 64   the IR of every pass at bs 8, 64
  attnmeta compile examples/mine.py:SPEC --modes decode          your own spec
  attnmeta compile triton --print-after fuse --dump-bs 8          the IR after fuse at bs 8
  attnmeta inspect dumps --diff --mode decode --bs 8              what each pass changed at bs 8
  attnmeta inspect dumps --html                                   one self-contained HTML report
  attnmeta demo --backend dsv4                                    a serving loop, every step checked
  attnmeta bench --backend triton                                 host time per step vs the floor
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

# the compiler (and torch) load when a command runs, not to parse its arguments: --help and inspect stay fast
from attnmeta.compiler.ir.errors import InternalError, OptionsError, UserError

from . import inspect as dumps
from .argparsing import Defaults, OneLine, device, positive, project_version, writable_dir, writable_file
from .names import BACKENDS, MODES, PASSES
from .table import table


def _progress(total: int | None, what: str, unit: str = "plan", items=None):
    """A progress bar with an ETA on a terminal (tqdm; silent when stderr is no terminal)."""
    from tqdm import tqdm

    return tqdm(items, total=total, desc=what, unit=unit, leave=False, disable=None, file=sys.stderr)


def _loop(items, what: str, unit: str):
    return _progress(None, what, unit, items)


def cmd_compile(a) -> int:
    import attrs

    from attnmeta.compiler import CompileOptions, compile_backend
    from attnmeta.compiler.instruments import Instrument, PrintIR

    dump = a.dump_dir or os.environ.get("ATTNMETA_DUMP_DIR") or ("attnmeta-dumps" if a.report else None)
    if a.out:
        writable_file(a.out, "--out")
    if isinstance(a.report, str):
        writable_file(a.report, "--report")
    sizes = tuple(a.capture_sizes or ())
    every = a.dump_bs == ["all"]
    try:
        dump_bs = () if every or not a.dump_bs else tuple(int(x) for x in a.dump_bs)
    except ValueError:
        raise OptionsError(f"--dump-bs takes batch sizes or 'all', got {a.dump_bs}") from None
    page = a.page_size if a.page_size is not None else _default_page(a.backend)
    opts = CompileOptions(max_bs=a.max_bs, page_size=page, max_context_len=a.max_context_len,
                          num_steps=a.num_steps, topk=a.topk, num_draft_tokens=a.num_draft_tokens,
                          sm_count=a.sm_count, num_heads=a.num_heads, num_kv_heads=a.num_kv_heads, modes=a.modes,
                          sliding_window=a.sliding_window, window_pool=a.window_pool,
                          capture_sizes=sizes, backend=own_options(a.backend, a),
                          dump_dir=writable_dir(dump) if dump else None,
                          dump_bs=dump_bs, dump_modes=tuple(a.dump_modes or ()),
                          force=a.force, disabled_passes=tuple(a.disable_pass or ()), verify_each=a.verify_each)
    if every:
        opts = attrs.evolve(opts, dump_bs=opts.sizes)
    from attnmeta.compiler.compile import dump_selection

    inst: list = []
    if a.print_after_all or a.print_after_change or a.print_after or a.print_before:
        inst.append(PrintIR(sys.stderr, after=None if a.print_after_all or a.print_after_change else set(
            a.print_after or ()), before=a.print_before or (), only_changes=a.print_after_change,
            select=dump_selection(opts)))
    elif not a.no_print_after_failure:
        inst.append(PrintIR(sys.stderr, after=set(), on_failure=True))
    bar = _progress(len({*opts.sizes, opts.max_bs}) * len({m.graph_key for m in opts.modes}), f"compile {a.backend}")

    class Progress(Instrument):
        def lowered(self, plan, ctx, seconds):
            bar.update(1)

    try:
        cb = compile_backend(a.backend, opts, instruments=[*inst, Progress()])
    except UserError:
        if opts.dump_dir:  # the failed run's dumps and report are what the user debugs it with
            _dumped(opts.dump_dir, a)
        raise
    finally:
        bar.close()
    shared = len(opts.modes) - len(cb.generic)  # idle replays decode's graph
    print(f"compiled {cb.spec.name}: {len(cb.plans)} plans ({len(opts.sizes)} capture sizes x "
          f"{len(cb.generic)} graphs for {len(opts.modes)} modes{'; idle uses decode' * (shared > 0)}) "
          f"in {cb.seconds:.3f} s")
    print(table(cb.summary(), ["mode", "bs", "out_graph", "in_graph", "kernels", "host_ops", "bytes_per_step",
                               "arena_kib"]))
    print("time (s, every size): " + ", ".join(f"{k} {v:.3f}" for k, v in cb.timing.seconds.items()))
    if a.out:
        print(f"artifact: {cb.save(a.out, ref=a.backend)} (load_compiled({a.out!r}))")
    if opts.dump_dir:
        _dumped(opts.dump_dir, a, cb.spec.name)
    return 0


# the backends' own options
OWN_FLAGS = ("index_topk", "compress_ratios", "plan_on_device", "max_kv_splits", "draft_window", "draft_sink",
             "attention_chunk")


def own_options(backend: str, a):
    """The backend's own options from the flags given for them (``compiler.backend_options``: a flag of another
    backend's options is refused, naming it)."""
    from attnmeta.compiler import backend_options

    return backend_options(backend, **{k: getattr(a, k) for k in OWN_FLAGS if getattr(a, k, None) is not None})


def _default_page(backend: str) -> int:
    """Pages of one token, unless the backend serves other sizes only (FlashMLA's 64, TRT-LLM MLA's 32 or 64):
    then the first it serves, said on stderr."""
    from attnmeta.compiler.spec import get_spec

    served = get_spec(backend).page_sizes
    if not served or 1 in served:
        return 1
    print(f"note: {backend} serves page sizes {list(served)}: compiling at {served[0]} (--page-size)",
          file=sys.stderr)
    return served[0]


def _dumped(dump_dir: str, a, name: str | None = None) -> None:
    """Name the run folder (and write its report when asked), after a complete or a failed compile."""
    from attnmeta.compiler.spec import get_spec

    try:
        name = name or get_spec(a.backend).name
        run = dumps.find_run(os.path.join(dump_dir, name))
    except UserError:
        return  # the spec did not load: nothing was dumped
    print(f"dumps: {run} (attnmeta inspect {run})")
    if a.report:
        from .report import write

        try:
            print(f"report: {write(run, a.report if isinstance(a.report, str) else None)}")
        except OSError as e:  # checked before the compile; the folder may have changed since
            raise OptionsError(f"--report: cannot write the report ({e}); give --report a writable file") from None


def _on_device(a, torch) -> None:
    if a.device and a.device.startswith("cuda") and not torch.cuda.is_available():
        raise OptionsError(f"--device {a.device}: this machine has no CUDA device; leave --device out (CPU here)")


def cmd_inspect(a) -> int:
    if a.html:
        writable_file(a.html, "--html")
    run = dumps.find_run(a.dir)
    if a.keep is not None:
        gone = dumps.prune(run, a.keep)
        print(f"removed {len(gone)} run(s): {', '.join(os.path.basename(g) for g in gone) or 'none'}")
    if a.runs or a.keep is not None:
        print(dumps.run_list(run))
        return 0
    dumps.check_filters(run, a.mode, a.pass_, a.diff)
    if a.html is not None:
        from .report import write

        print(f"report: {write(run, a.html or None)}")
        return 0
    print(dumps.pass_table(run, a.mode, a.bs, a.pass_))
    failed = dumps.failure(run)
    if failed:
        print(failed)
    if a.diff:
        for mode in [a.mode] if a.mode else dumps.modes(run):
            for bs in [a.bs] if a.bs is not None else dumps.sizes(run, mode)[:1]:
                print(f"\n== {mode}, bs {bs} ==")
                print(dumps.diffs(run, mode, bs, a.pass_), end="")
    return 0


def cmd_demo(a) -> int:
    import torch

    _on_device(a, torch)
    drafts = a.backend.startswith("multistep_") or a.backend == "flashattention_draft"
    given = [f for f, v in (("--topk", a.topk), ("--num-steps", a.num_steps)) if v != {"--topk": 1,
                                                                                      "--num-steps": 3}[f]]
    if given and not drafts:
        raise OptionsError(f"{' and '.join(given)} set the EAGLE drafter's steps, and {a.backend!r} is not a drafter: "
                           f"run demo --backend multistep_{a.backend} (or flashattention_draft), or leave them out")
    too_big = [s for s in a.capture_sizes or () if not 1 <= s <= a.max_bs]
    if too_big:
        raise OptionsError(f"--capture-sizes {too_big} are outside 1..--max-bs={a.max_bs}; raise --max-bs or drop them")
    rc = _kernels(a, torch)
    if rc is not None:
        return rc
    from .demo import format_result, run_demo

    kw = {"capture_sizes": tuple(a.capture_sizes)} if a.capture_sizes else {}
    r = run_demo(a.backend, steps=a.steps, max_bs=a.max_bs, device=a.device, seed=a.seed, num_steps=a.num_steps,
                 topk=a.topk, progress=_loop, **kw)
    print(format_result(r))
    for f in r.failures[:5]:
        print(f"  mismatch at step {f[0]} (bs {f[1]}): {', '.join(f[2])}")
    ok = r.mismatches == 0 and r.max_abs_diff < 1e-5
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def _kernels(a, torch) -> int | None:
    """--kernels triton on a CPU needs Triton's interpreter, chosen when the process starts: rerun this
    command in a process that asks for it (this process's own environment stays as it is)."""
    if a.kernels != "triton" or torch.cuda.is_available():
        return None
    from attnmeta.compiler.lowering import triton_kernels

    if triton_kernels.INTERPRET:
        triton_kernels.set_cpu_kernels("triton")
        return None
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    return subprocess.run([sys.executable, "-m", "attnmeta.app.cli", *sys.argv[1:]], env=env).returncode


def cmd_bench(a) -> int:
    import json

    import torch

    from .bench import format_table, planner_for, planner_label, run_bench

    _on_device(a, torch)
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    planner_for(a.backend, torch.device(dev), a.planner)  # a planner this machine lacks: refused before any note
    if a.e2e_layers:
        from .e2e import check_e2e

        check_e2e(a.backend, a.page_size)
    if dev == "cpu":
        from attnmeta.compiler.lowering.triton_kernels import set_cpu_kernels

        set_cpu_kernels("torch")  # the interpreter would swamp host time
        print("note: on a CPU, 'device' work runs on the host too; only GPU numbers show host overhead alone; "
              "kernels run as torch", file=sys.stderr)  # stdout stays the table, or JSON that parses
    if a.e2e_layers:
        from .e2e import format_e2e, run_e2e

        rows = run_e2e(a.backend, sizes=tuple(a.sizes), layers=a.e2e_layers, iters=min(a.iters, 100),
                       max_context_len=a.max_context_len, progress=_loop, page_size=a.page_size)
        print(json.dumps(rows, indent=1) if a.json else format_e2e(rows, torch.cuda.get_device_name(), a.backend))
        return 0
    rows, planner = run_bench(a.backend, sizes=tuple(a.sizes), iters=a.iters, max_context_len=a.max_context_len,
                              device=dev, progress=_loop, planner=a.planner, mode=a.mode,
                              plan_on_device=a.plan_on_device)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    if a.json:
        print(json.dumps({"backend": a.backend, "mode": a.mode, "device": name, "planner": planner,
                          "plan_on_device": a.plan_on_device, "planner_label": planner_label(planner),
                          "iters": a.iters, "max_context_len": a.max_context_len, "rows": rows}, indent=1))
    else:
        print(format_table(rows, name, planner, a.mode, a.plan_on_device))
    return 0


def parser() -> argparse.ArgumentParser:
    fmt = Defaults
    p = OneLine(prog="attnmeta", description=__doc__.split("\n\n")[0],
                                epilog="examples:" + __doc__.split("examples:")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"attnmeta {project_version()}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=OneLine)
    c = sub.add_parser("compile", help="compile a backend spec ahead of serving", formatter_class=fmt)
    c.add_argument("backend", help=f"a backend ({', '.join(BACKENDS)}; or another installed package's), or your "
                                   "spec as pkg.module:SPEC or path/to/file.py:SPEC")
    c.add_argument("--modes", nargs="+", default=["decode", "idle"], choices=MODES, help="forward modes to compile")
    c.add_argument("--max-bs", type=positive, default=256, help="the largest batch; static buffers are sized for it")
    c.add_argument("--capture-sizes", type=positive, nargs="+", help="batch sizes to compile for capture "
                                                                "(default: 1 2 4 8 12 16 24 ... up to --max-bs)")
    c.add_argument("--page-size", type=int, default=None,
                   help="KV page size (a power of two; default 1, or the first a backend serves when it serves not 1)")
    c.add_argument("--max-context-len", type=positive, default=4096, help="tokens per request at most (L)")
    c.add_argument("--num-steps", type=positive, default=3, help="draft steps per round (multistep_*)")
    c.add_argument("--topk", type=positive, default=1, help="draft branches per request (multistep_*)")
    c.add_argument("--num-draft-tokens", type=positive, default=4, help="tokens verified per request (target_verify)")
    c.add_argument("--sm-count", type=int, default=132, help="SMs of the target GPU (triton's split heuristic)")
    c.add_argument("--num-heads", type=positive, default=32, help="query heads of the model (triton's split heuristic)")
    c.add_argument("--num-kv-heads", type=positive, default=8, help="KV heads of the model (triton's split heuristic)")
    c.add_argument("--sliding-window", type=int, default=0,
                   help="tokens the model's sliding-window layers read (0: none; triton)")
    c.add_argument("--window-pool", action="store_true",
                   help="the window layers' KV lives in a pool of its own, reached through a full-to-window slot "
                        "table (SGLang's SWAKVPool)")
    # the backend's own options (its folder's options class): given only for a backend that has them
    c.add_argument("--index-topk", type=int, choices=[512, 1024],
                   help="dsv4: compressed entries the indexer selects per query (the model's index_topk; 512)")
    c.add_argument("--compress-ratios", type=int, nargs="*", metavar="R",
                   help="dsv4: the compression ratios the model's KV pool has, of 4 and 128 (none: SWA only; 4 128)")
    c.add_argument("--plan-on-device", action="store_true", default=None,
                   help="flashinfer specs: no host indptrs; the split-KV partition is planned on the GPU every step "
                        "(FlashInferDecodeAdapter's device planner, FlashInfer 0.6)")
    c.add_argument("--max-kv-splits", type=int,
                   help="triton specs: the most KV splits a row may get (SGLang's --triton-attention-num-kv-splits; 8)")
    c.add_argument("--draft-window", type=int,
                   help="multistep_triton: EAGLE's drafter attends to its prefix's last N tokens (and its sink), then "
                        "its drafts (SGLang's --speculative-draft-window-size; 0: the whole prefix)")
    c.add_argument("--draft-sink", type=int,
                   help="multistep_triton: the prefix's first N tokens the drafter keeps beside its draft window "
                        "(SGLang's --speculative-draft-sink-size)")
    c.add_argument("--attention-chunk", type=int,
                   help="flashattention: chunked local attention's chunk in tokens (Llama 4's attention_chunk_size; "
                        "decode, and target_verify at topk 1)")
    c.add_argument("--dump-dir", help="write each pass's IR, the generated code and a pass table into a run folder "
                                      "there (also ATTNMETA_DUMP_DIR)")
    c.add_argument("--dump-bs", nargs="+", metavar="BS", help="sizes to dump, or 'all' (default: the largest captured)")
    c.add_argument("--dump-modes", nargs="+", choices=MODES, help="modes to dump (default: all)")
    c.add_argument("--out", metavar="FILE", help="write the compiled backend to FILE, to load ahead of serving "
                                                "(attnmeta.compiler.load_compiled): no pass runs at load")
    c.add_argument("--report", nargs="?", const=True, metavar="FILE", help="also write the HTML report (default "
                                                                           "FILE: <run>/report.html)")
    c.add_argument("--print-after-all", action="store_true", help="print the IR after every pass (stderr)")
    c.add_argument("--print-after-change", action="store_true", help="print the IR after passes that changed it")
    c.add_argument("--print-after", nargs="+", choices=PASSES, metavar="PASS", help="print the IR after these passes")
    c.add_argument("--print-before", nargs="+", choices=PASSES + ["lower"], metavar="PASS",
                   help="print the IR before these passes (lower: the IR lowering reads)")
    c.add_argument("--no-print-after-failure", action="store_true", help="do not print the IR a pass failed on")
    c.add_argument("--disable-pass", nargs="+", metavar="PASS", help="skip passes by name, to bisect")
    c.add_argument("--force", action="store_true", help="allow --disable-pass to switch off a safety pass "
                                                        "(verify, check-split)")
    c.add_argument("--verify-each", action="store_true", help="run the verifier after every pass")
    c.set_defaults(fn=cmd_compile)
    i = sub.add_parser("inspect", help="what a compile did: the pass table, diffs, an HTML report", formatter_class=fmt)
    i.add_argument("dir", help="a dump directory, a backend's folder in it, or one run folder")
    i.add_argument("--diff", action="store_true", help="show what each pass changed (one mode and size)")
    i.add_argument("--mode", choices=MODES, help="only this mode")
    i.add_argument("--bs", type=positive, help="only this batch size (default with --diff: the first dumped)")
    i.add_argument("--pass", dest="pass_", choices=PASSES + ["lower"], help="only this pass")
    i.add_argument("--html", nargs="?", const="", metavar="FILE", help="write the HTML report (default "
                                                                       "<run>/report.html)")
    i.add_argument("--runs", action="store_true", help="list the backend's runs (status, passes, the latest)")
    i.add_argument("--keep", type=positive, metavar="N", help="delete all but the newest N runs, then list them")
    i.set_defaults(fn=cmd_inspect)
    d = sub.add_parser("demo", help="a serving loop, every step checked against the eager twin and a pool oracle",
                       formatter_class=fmt)
    d.add_argument("--backend", default="flashinfer", choices=BACKENDS,
                   help="the backend whose metadata the loop's attention reads (a built-in kind: the demo's model "
                        "reads its fields; a spec of your own runs in examples/serve.py); multistep_* and "
                        "flashattention_draft run the EAGLE drafter's steps")
    d.add_argument("--num-steps", type=positive, default=3, help="draft steps per round (multistep_*)")
    d.add_argument("--topk", type=positive, default=1, help="draft branches per request (multistep_*)")
    d.add_argument("--steps", type=positive, default=120, help="serving steps to run")
    d.add_argument("--max-bs", type=positive, default=48, help="the largest batch")
    d.add_argument("--capture-sizes", type=positive, nargs="+", help="default: 1 2 4 8 16 24 32 (up to --max-bs)")
    d.add_argument("--device", type=device, default=None, help="cuda or cpu (default: cuda when there is one)")
    d.add_argument("--kernels", choices=["torch", "triton"], default="torch",
                   help="on a CPU: kernels as torch, or in Triton's interpreter (slow; what the tests check)")
    d.add_argument("--seed", type=int, default=0, help="the scheduler's random seed")
    d.set_defaults(fn=cmd_demo)
    be = sub.add_parser("bench", help="host time per step: compiled replay vs the floor and the eager twin",
                        formatter_class=fmt)
    be.add_argument("--backend", default="flashinfer", help="the backend to measure: a built-in kind with an eager "
                    "twin to time against (the MLA draft kinds and cutedsl_mla have none here; a spec of your own: "
                    "time it in examples/serve.py)", choices=[
        *(f"{w}{b}" for w in ("", "tbo_") for b in ("flashinfer", "flashattention", "triton", "trtllm_mha")),
        "multistep_flashinfer", "multistep_triton", "dsv4", "flashmla", "trtllm_mla"])
    be.add_argument("--sizes", type=positive, nargs="+", default=[1, 8, 64, 256], help="batch sizes to measure")
    be.add_argument("--iters", type=positive, default=300, help="timed steps per size and column")
    be.add_argument("--max-context-len", type=positive, default=4096, help="L")
    be.add_argument("--device", type=device, default=None, help="cuda or cpu (default: cuda when there is one)")
    be.add_argument("--planner", choices=["auto", "flashinfer", "flashinfer-host", "stand-in"], default="auto",
                    help="flashinfer's planner: FlashInfer's (GPU with FlashInfer; the compiled step plans on the "
                         "GPU), flashinfer-host (the compiled step calls FlashInfer's host planner), or the CPU "
                         "stand-in; auto takes FlashInfer where it can")
    be.add_argument("--plan-on-device", action="store_true",
                    help="compile with plan_on_device: no host indptrs in out_graph (FlashInfer backends)")
    be.add_argument("--mode", default="decode", choices=["decode", "target_verify", "draft_extend"],
                    help="the forward mode of the measured steps (draft tokens: 4)")
    be.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    be.add_argument("--page-size", type=positive, default=1, help="with --e2e-layers and flashattention: the pool's "
                    "page size, 16 or more (FlashInfer's XQA reads the page table)")
    be.add_argument("--e2e-layers", type=positive, default=None, metavar="N",
                    help="instead: a decode loop of N layers of real attention per step, wall time, attnmeta vs "
                         "the eager metadata path (GPU)")
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
