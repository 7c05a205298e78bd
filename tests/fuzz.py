"""Property-based fuzzing of every input boundary (hypothesis), run by ``tests/test_fuzz.py``.

The property everywhere: what goes in comes out as attnmeta's typed error (a ``UserError``: a
``BatchError``, ``SpecError``, ``ParseError`` ...), or as the right result (metadata equal to the
eager twin and the reference interpreter; a parsed graph equal to the printed one; a CLI exit 0 or
2 with one line) - never another exception, never a crash. Crash-prone cases run in a subprocess:
``python -m tests.fuzz PROFILE`` runs every property with that profile and prints the count of cases;
a segfault or abort there fails the test that started it, with the seed hypothesis printed.

Boundaries: batches (each field's dtype, shape, stride, range, NaN/inf, padding count, mode) into a
compiled backend; SGLang-style replay views (``num_padding``, ``actual_forward_mode``) through the
integration's ``BatchView``; a graph runner's own buffers (a plan captured on them reads them in place:
steps on views backed by them and on views of other tensors, interleaved, with bad values among them,
which the step or the next one raises); specs (slices, fills, divisors, kinds); ``.ir`` text; CLI
options.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph, parse, print_graph
from attnmeta.compiler.ir.errors import AttnmetaError, UserError
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.oracles import assert_metadata_equal, padded

PROFILES = {"fast": 60, "long": 27000}  # examples per property (long: over 100k cases in all)
L, ROWS, MAX_BS, SIZES, WINDOW = 96, 12, 8, (2, 8), 24
KINDS = ("triton", "flashinfer", "flashattention", "triton_window")
COUNT = {"cases": 0, "accepted": 0}


def _compiled():
    cache = _compiled.__dict__.setdefault("cache", {})
    if not cache:
        for name in ("triton", "flashinfer", "flashattention"):
            cache[name] = compile_backend(name, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                               modes=("decode", "idle")))
        # a sliding-window model (one pool): the window's fields beside the full layers'
        cache["triton_window"] = compile_backend("triton", CompileOptions(
            max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, modes=("decode", "idle"), sliding_window=WINDOW))
    return cache


def _twin(name: str):
    """The backend's eager twin over the fuzz pool."""
    if name == "triton_window":
        return get_eager("triton")(_pool(), MAX_BS, sliding_window=WINDOW)
    return get_eager(name)(_pool(), MAX_BS) if name != "flashattention" else get_eager(name)(_pool(), MAX_BS, 1)


def _pool() -> torch.Tensor:
    t = torch.arange(ROWS * L, dtype=torch.int32).view(ROWS, L) + 1
    t[0] = 0
    return t


DTYPES = st.sampled_from([torch.int32, torch.int64, torch.int16, torch.uint8, torch.float32, torch.bool])
VALUES = st.one_of(st.integers(-3, L + 3), st.sampled_from([-(2 ** 31), 2 ** 31, 2 ** 40, 0, 1, L]))


@st.composite
def batches(draw):
    """A batch as a buggy engine might build it: every field's dtype, length, layout and values drawn."""
    n = draw(st.integers(0, MAX_BS + 2))
    mode = draw(st.sampled_from([ForwardMode.DECODE, ForwardMode.IDLE, "decode", None]))

    def field(valid_lo, valid_hi):
        k = draw(st.sampled_from(["good", "good", "good", "dtype", "short", "2d", "strided", "values", "nan", "none",
                                  "list"]))
        vals = [draw(st.integers(valid_lo, valid_hi)) for _ in range(n)]
        if k == "values":
            vals = [draw(VALUES) for _ in range(n)]
        if k == "none":
            return None
        if k == "list":
            return vals
        t = torch.tensor(vals, dtype=torch.int64 if k != "dtype" else draw(DTYPES))
        if k == "short":
            return t[: max(n - 1, 0)]
        if k == "2d":
            return t.view(-1, 1).repeat(1, 2)
        if k == "strided":
            return torch.stack([t, t], 1)[:, 0]
        if k == "nan":
            f = t.float()
            if n:
                f[0] = draw(st.sampled_from([float("nan"), float("inf"), -float("inf")]))
            return f
        return t.to(torch.int32) if draw(st.booleans()) else t

    seq, rows = field(1, L), field(1, ROWS - 1)
    seq_t = seq if isinstance(seq, torch.Tensor) else None
    fb = ForwardBatch(mode if isinstance(mode, ForwardMode) else ForwardMode.DECODE, n, req_pool_indices=rows,
                      req_pool_indices_cpu=rows if draw(st.booleans()) else None, seq_lens=seq_t,
                      seq_lens_cpu=seq if draw(st.booleans()) else seq_t)
    if mode is None or isinstance(mode, str):
        object.__setattr__(fb, "forward_mode", mode) if hasattr(fb, "__attrs_attrs__") else None
    if draw(st.booleans()):  # a replay view: padded to a captured size, some rows padding
        bs = draw(st.sampled_from(SIZES + (n, n + 1)))
        raw = draw(st.integers(-2, bs + 1))
        fb = ReplayView(bs, fb.forward_mode, draw(st.sampled_from([fb.forward_mode, ForwardMode.IDLE])), raw,
                        req_pool_indices=fb.req_pool_indices, req_pool_indices_cpu=fb.req_pool_indices_cpu,
                        seq_lens=fb.seq_lens, seq_lens_cpu=fb.seq_lens_cpu)
    return fb


def _good(fb) -> bool:
    """Whether the batch is one a correct engine could send (the oracle then must agree): a decode batch
    of at least one request, each at least one token long (a decode step decodes one; the twin, written
    as engines write it, divides by the shortest length, as SGLang's split heuristic does)."""
    seq = fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens
    return (isinstance(fb, ForwardBatch) and fb.forward_mode is ForwardMode.DECODE and fb.batch_size >= 1
            and int(torch.as_tensor(seq).reshape(-1)[: fb.batch_size].min()) >= 1)


def check_batch(name: str, fb) -> None:
    """The boundary's property for one backend and batch."""
    COUNT["cases"] += 1
    be = _compiled()[name].instantiate(_pool())
    try:
        be.init_forward_metadata(fb)
    except UserError:
        return
    COUNT["accepted"] += 1
    if _good(fb):  # accepted: the metadata is the twin's and the interpreter's, on the batch's values
        bs = fb.batch_size
        rows = fb.req_pool_indices_cpu if fb.req_pool_indices_cpu is not None else fb.req_pool_indices
        seq = fb.seq_lens_cpu if fb.seq_lens_cpu is not None else fb.seq_lens
        clean = padded(ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=torch.as_tensor(rows).reshape(-1)[:bs]
                                    .long(), seq_lens=torch.as_tensor(seq).reshape(-1)[:bs].int(),
                                    seq_lens_cpu=torch.as_tensor(seq).reshape(-1)[:bs].int()), bs)
        assert_metadata_equal(be.forward_metadata, _twin(name).init_forward_metadata(clean), clean.seq_lens_cpu, 1)
        want = eval_graph(_compiled()[name].plan(ForwardMode.DECODE, bs).graph, _interp_inputs(clean, bs))
        for field, w in want.items():
            if isinstance(w, torch.Tensor) and not field.endswith(("kv_indices", "page_table")):
                assert torch.equal(getattr(be.forward_metadata, field).cpu(), w), field


def _interp_inputs(fb, bs):
    from tests.batches import interp_inputs

    return interp_inputs(fb, bs, _pool(), {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0})


# one step on a graph runner's buffers: (live rows, on the runner's buffers or fresh tensors, which value is bad)
ENGINE_STEPS = st.lists(st.tuples(st.integers(1, MAX_BS), st.booleans(),
                                  st.sampled_from(["", "", "", "row", "negative row", "length"]),
                                  st.integers(0, 2 ** 16)), min_size=1, max_size=8)
BAD = {"row": ("rows", ROWS), "negative row": ("rows", -1), "length": ("seq", L + 1)}  # a length of 0 is served


def check_engine(name: str, steps) -> None:
    """A plan captured as SGLang's runner captures (one set of buffers for every size, largest first) and
    replayed on them, or on a view of other tensors: a good step's metadata is the twin's on the padded
    batch; a bad value is raised by its own step or the next one, and never served silently after that."""
    import random

    from attnmeta.runtime import new_graph

    be = _compiled()[name].instantiate(_pool())
    seq_b, rows_b = torch.ones(MAX_BS, dtype=torch.int64), torch.zeros(MAX_BS, dtype=torch.int64)
    seq_cpu_b, graphs = torch.ones(MAX_BS, dtype=torch.int64), {}
    for bs in sorted(SIZES, reverse=True):
        v = ReplayView(bs, ForwardMode.DECODE, ForwardMode.DECODE, 0, req_pool_indices=rows_b[:bs],
                       seq_lens=seq_b[:bs], seq_lens_cpu=seq_cpu_b[:bs])
        be.init_forward_metadata_out_graph(v, in_capture=True)
        g = graphs[bs] = new_graph("cpu")
        with g.capture():
            be.init_forward_metadata_in_graph(v)
    pending = False  # a bad value served by the last step, which this one must raise
    for n, backed, bad, seed in [*steps, (1, True, "", 0)]:
        COUNT["cases"] += 1
        rng = random.Random(seed)
        bs = min(s for s in SIZES if s >= n)
        vals = {"rows": [rng.randint(1, ROWS - 1) for _ in range(n)], "seq": [rng.randint(1, L) for _ in range(n)]}
        if bad:
            field, value = BAD[bad]
            vals[field][rng.randrange(n)] = value
        rows, seq = torch.tensor(vals["rows"]), torch.tensor(vals["seq"])
        if backed:  # the runner's copies into its buffers, padding past the live rows
            for buf, live, fill in ((rows_b, rows, 0), (seq_b, seq, 1), (seq_cpu_b, seq, 1)):
                buf.fill_(fill)
                buf[:n] = live
            v = ReplayView(bs, ForwardMode.DECODE, ForwardMode.DECODE, n, req_pool_indices=rows_b[:bs],
                           seq_lens=seq_b[:bs], seq_lens_cpu=seq_cpu_b[:bs])
        else:
            v = ReplayView(bs, ForwardMode.DECODE, ForwardMode.DECODE, n, req_pool_indices=rows.clone(),
                           seq_lens=seq.clone(), seq_lens_cpu=seq.clone())
        try:
            be.init_forward_metadata_out_graph(v)
        except UserError:
            pending = False  # raised: this step's bad value, or the last step's
            continue
        assert not pending, (name, "a bad value of the last step was not raised", steps)
        graphs[bs].replay()
        pending = bool(bad)
        if bad:
            continue
        COUNT["accepted"] += 1
        clean = padded(ForwardBatch(ForwardMode.DECODE, n, req_pool_indices=rows, seq_lens=seq.int(),
                                    seq_lens_cpu=seq.int()), bs)
        assert_metadata_equal(be.forward_metadata, _twin(name).init_forward_metadata(clean), clean.seq_lens_cpu, 1)
    assert not pending, (name, "the last bad value was never raised", steps)


IR_EDITS = st.lists(st.tuples(st.integers(0, 4000), st.sampled_from(['"\\q"', "%", "[", "]", "(", "bs", "-1", "@",
                                                                     "i32", "{", "}", "\n", ",", "x", '"', "\\"])),
                    max_size=4)


def check_ir(edits) -> None:
    COUNT["cases"] += 1
    g = _compiled()["triton"].plan(ForwardMode.DECODE, 8).graph
    text = print_graph(g)
    for at, s in edits:
        at %= len(text) + 1
        text = text[:at] + s + text[at:]
    try:
        g2 = parse(text)
    except UserError:
        return
    if not edits:
        assert g2 == g


SPEC_ARGS = st.tuples(st.sampled_from(["bs", "bs - 3", "bs + 1", 0, 2, "max_bs", "L", -1]),
                      st.sampled_from(["floordiv", "mod", "add", "ceildiv"]), st.sampled_from([0, 1, 2, -1, 1.5, True]),
                      st.sampled_from([1, 0, -1, 1.5, True, None]))


def check_spec(args) -> None:
    from attnmeta.compiler import BackendSpec
    from attnmeta.compiler.ir import DType, Kind, Placement, SpecBuilder

    COUNT["cases"] += 1
    stop, fn, const, fill = args

    def build(mode, options):
        b = SpecBuilder("fuzz")
        seq = b.input("seq_lens", DType.int32, ["bs"], fill=fill, mirror="seq_lens_cpu", kind=Kind.length)
        b.input("seq_lens_cpu", DType.int32, ["bs"], Placement.host, fill=fill, kind=Kind.length)
        with b.in_graph():
            x = b.ewise(fn, b.slice(seq, 0, stop), const)
        b.outputs(x=x)
        return b.build()

    try:
        compile_backend(BackendSpec("fuzz", build, (ForwardMode.DECODE,)),
                        CompileOptions(max_bs=4, capture_sizes=(1, 4), max_context_len=16))
    except UserError:
        return


CLI_ARGS = st.lists(st.sampled_from(["compile", "inspect", "bench", "demo", "triton", "flashinfer", "nope", "--max-bs",
                                     "0", "-3", "4", "x", "--page-size", "3", "--modes", "decode", "verify",
                                     "--dump-bs", "999", "--disable-pass", "fuse", "--force", "--sm-count", "--topk",
                                     "--max-context-len", "1"]), max_size=7)


def check_cli(argv) -> None:
    from attnmeta.app.cli import main

    COUNT["cases"] += 1
    if argv[:1] in (["demo"], ["bench"]) or "--help" in argv:
        argv = ["compile", *argv[1:]]  # the long-running commands are fuzzed through compile's options
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a usage error is exit 2
            code = e.code
    assert code in (0, 2), (argv, code, err.getvalue()[-500:])
    if code == 2:
        assert "Traceback" not in err.getvalue(), (argv, err.getvalue())


def run(profile: str) -> int:
    """Every property with ``profile``'s number of examples; returns the cases run."""
    n = PROFILES[profile]
    cfg = settings(max_examples=n, deadline=None, database=None, derandomize=profile == "fast",
                   suppress_health_check=list(HealthCheck))
    for name in KINDS:
        cfg(given(st.just(name), batches())(check_batch))()
    for name in KINDS:
        settings(cfg, max_examples=max(n // 20, 20))(given(st.just(name), ENGINE_STEPS)(check_engine))()
    cfg(given(IR_EDITS)(check_ir))()
    cfg(given(SPEC_ARGS)(check_spec))()
    settings(cfg, max_examples=max(n // 20, 20))(given(CLI_ARGS)(check_cli))()
    return COUNT["cases"]


if __name__ == "__main__":
    os.environ.setdefault("ATTNMETA_VERIFY", "1")
    from tests.interpreter import lighter_interpreter

    lighter_interpreter()  # Triton's overflow checks stay on here: the fuzzer's values reach past int32
    try:
        print("cases", run(sys.argv[1] if len(sys.argv) > 1 else "fast"), "batches accepted", COUNT["accepted"],
              flush=True)
    except AttnmetaError as e:  # an attnmeta error escaping a property is a finding too: say which
        print(f"untyped escape: {type(e).__name__}: {e}", flush=True)
        raise
